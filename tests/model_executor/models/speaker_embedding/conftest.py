# SPDX-License-Identifier: Apache-2.0
"""The audio tests' real-speech fixture, for the speaker-feature tests that moved here with their module."""

from __future__ import annotations

from tests.model_executor.models.audio.conftest import speech_16k

__all__ = ["speech_16k"]
