# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow streaming cost per chunk (`bench cosyvoice3-flow`): run, report and CLI in one home."""
