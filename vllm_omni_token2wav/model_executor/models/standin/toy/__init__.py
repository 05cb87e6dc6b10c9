# SPDX-License-Identifier: Apache-2.0
"""Upstream's own model pipelines at toy size (placeholder: the toy registry `TOY_PIPELINES` lands here at merge)."""
