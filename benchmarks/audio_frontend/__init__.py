# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.audio_frontend`: the torch audio front end (Kaldi fbank, 24 kHz mel) vs kaldi-native-fbank."""
