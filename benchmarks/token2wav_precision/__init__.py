# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.token2wav_precision`: mel and audio of a reduced-precision flow against the fp32 flow."""
