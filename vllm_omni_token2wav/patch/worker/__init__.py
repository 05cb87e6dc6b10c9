# SPDX-License-Identifier: Apache-2.0
"""Patches that act in the engine processes: the engine core (scheduler) and the model-runner workers (graphs).

One module per patched upstream object, each with its row in `patch/register.py`. The plugin installs them in
every process that loads it (`patch.apply_engine_patches`); they only change behaviour where the patched
object runs.
"""
