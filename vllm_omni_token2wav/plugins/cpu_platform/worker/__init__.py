# SPDX-License-Identifier: Apache-2.0
"""CPU workers and model runners for vLLM-Omni stages (`../platform.py` names them)."""
