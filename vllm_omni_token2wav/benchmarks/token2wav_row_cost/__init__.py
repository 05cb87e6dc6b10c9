# SPDX-License-Identifier: Apache-2.0
"""Token2Wav stage cost per row by part (`bench token2wav-row-cost`): run, report and CLI in one home."""
