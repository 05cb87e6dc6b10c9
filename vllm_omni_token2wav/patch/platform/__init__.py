# SPDX-License-Identifier: Apache-2.0
"""Patches that matter in every process that loads the plugin (the orchestrator / API server included).

One module per patched upstream object, each with its row in `patch/register.py`.
"""
