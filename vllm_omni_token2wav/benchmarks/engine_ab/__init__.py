# SPDX-License-Identifier: Apache-2.0
"""`bench engine-ab`: vLLM-Omni 0.30's own code2wav stage classes against ours, in the same real engine run."""
