# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for what a real deployment has and CI cannot: a codec-token producer and model folders."""
