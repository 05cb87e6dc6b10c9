# SPDX-License-Identifier: Apache-2.0
"""CosyVoice2-family synthesis models owned in-tree for the Token2Wav stage.

Step-Audio2 and MiniCPM-o 4.5 ship a `token2wav/` directory whose models upstream are built by
importing an external `cosyvoice2` package through hyperpyyaml. This package holds in-tree
equivalents that load the same files, so the stage runs on NPU/CUDA/CPU without that package:

- `flow/`: the flow-matching model (conformer encoder + DiT estimator + CFM sampler) of `flow.yaml` + `flow.pt`.
- `hift/`: the HiFT vocoder of `hift.pt`.
- `speech_tokenizer/`: the 25 Hz speech tokenizer of `speech_tokenizer_v2_25hz.onnx`.
"""
