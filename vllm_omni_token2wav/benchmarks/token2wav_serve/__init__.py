# SPDX-License-Identifier: Apache-2.0
"""Token2Wav stage under concurrent load (`bench token2wav-serve`, emulated and `--engine`): one home."""
