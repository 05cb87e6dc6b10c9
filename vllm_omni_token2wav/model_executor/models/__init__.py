# SPDX-License-Identifier: Apache-2.0
"""One package per model family: campplus (speaker net), cosyvoice2/3, step_audio2, minicpmo_4_5, audio front end."""
