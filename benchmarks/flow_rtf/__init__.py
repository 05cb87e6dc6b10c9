# SPDX-License-Identifier: Apache-2.0
"""`python -m benchmarks.flow_rtf`: the in-tree flow model (encoder + DiT + CFM) at full size, mel frames/s and RTF."""
