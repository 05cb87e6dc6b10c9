# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.prompt_path`: end-to-end cost of `prepare_prompt` (a reference voice's request path)."""
