# SPDX-License-Identifier: Apache-2.0
"""One vs two replicas of our code2wav stage in one vLLM-Omni deployment: throughput, and every reply whole."""
