# SPDX-License-Identifier: Apache-2.0
"""CPU workers and model runners for vLLM-Omni stages (`engine_platform.py` names them)."""
