# SPDX-License-Identifier: Apache-2.0
"""CosyVoice3 flow cross-request launch, B streams in one call vs B calls (the developer benchmark of this home)."""
