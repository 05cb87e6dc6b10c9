# SPDX-License-Identifier: Apache-2.0
"""Step-Audio2 / MiniCPM-o Token2Wav RTF and first audio (`bench token2wav`): run, report and CLI in one home."""
