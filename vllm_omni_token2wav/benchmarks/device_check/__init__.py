# SPDX-License-Identifier: Apache-2.0
"""The bounded device check an accelerator session runs (`bench device-check`, `benchmarks/device_check.py`)."""
