# SPDX-License-Identifier: Apache-2.0
"""NPU attention-path patches (static-shape decode, ACL graph capture guard)."""
