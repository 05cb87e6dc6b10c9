# SPDX-License-Identifier: Apache-2.0
"""Small data files the package ships (see README.md in this folder for sources and licences)."""
