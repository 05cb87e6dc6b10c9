# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers: marks (`mark.py`) and stand-in assets built by fixtures."""
