# SPDX-License-Identifier: Apache-2.0
"""Causal HiFT streaming cost per chunk (`bench causal-hift`): run, report and CLI in one home."""
