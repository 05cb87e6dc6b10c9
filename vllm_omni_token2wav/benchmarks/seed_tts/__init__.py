# SPDX-License-Identifier: Apache-2.0
"""The Seed-TTS WER gate (`bench seed-tts`): meta reader, ASR backends, HTTP driver, scoring and CLI in one home."""
