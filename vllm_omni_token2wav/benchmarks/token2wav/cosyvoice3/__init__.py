# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 code2wav RTF / first audio / cost per chunk (`bench token2wav --family cosyvoice3`)."""
