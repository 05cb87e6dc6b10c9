# SPDX-License-Identifier: Apache-2.0
"""Token2Wav stage cost per row by part (`python -m benchmarks.token2wav_row_cost`): run, report and CLI in one home."""
