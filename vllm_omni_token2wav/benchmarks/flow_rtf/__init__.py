# SPDX-License-Identifier: Apache-2.0
"""`bench flow-rtf`: the in-tree flow model (encoder + DiT + CFM) at full size, mel frames/s and RTF."""
