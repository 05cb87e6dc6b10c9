# SPDX-License-Identifier: Apache-2.0
"""Benchmark data sets (readers for meta files and bundled demo sets)."""
