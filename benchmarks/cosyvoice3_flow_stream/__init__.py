# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow streaming cost per chunk: run, report and CLI in one home."""
