# SPDX-License-Identifier: Apache-2.0
"""CAM++ speaker-embedding A/B report (`bench spk-embedding`): run, report and CLI in one home."""
