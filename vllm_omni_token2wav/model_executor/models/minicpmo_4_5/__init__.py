# SPDX-License-Identifier: Apache-2.0
"""MiniCPM-o 4.5 Token2Wav: the eager facade (`minicpmo_4_5_token2wav`) and the code2wav stage glue."""
