# SPDX-License-Identifier: Apache-2.0
"""What every in-tree model loader shares: hyperpyyaml files read as data, and checked state_dict files.

`tagged_yaml` reads the model directories' hyperpyyaml (`flow.yaml`, `cosyvoice3.yaml`) without
importing the classes they name; `state_dict` reads `*.pt` weights, checks their key layout against
a model with errors that name the file and the tensor, and writes deterministic stand-in weights.
"""
