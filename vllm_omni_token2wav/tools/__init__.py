# SPDX-License-Identifier: Apache-2.0
"""Library code the scripts under the repository's `tools/` share (they import it, never each other)."""
