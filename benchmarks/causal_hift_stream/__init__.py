# SPDX-License-Identifier: Apache-2.0
"""Causal HiFT streaming cost per chunk (`python -m benchmarks.causal_hift_stream`): run, report and CLI in one home."""
