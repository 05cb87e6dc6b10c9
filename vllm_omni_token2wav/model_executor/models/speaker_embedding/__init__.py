# SPDX-License-Identifier: Apache-2.0
"""Where the speaker embedding happens: CAM++ on the serving device, or onnxruntime on the CPU.

A Token2Wav request's reference voice becomes a 192-dim speaker embedding here, in three steps, each
in one module of this folder:

1. `features.speaker_features`: the CAM++ input, 80-bin Kaldi fbank of the 16 kHz prompt minus its
   mean, computed on the waveform's device (fbank geometry: `audio/speaker_fbank.py`);
2. `selection.select_speaker_embedding_backend`: which runner (the one table, the CPU policy);
3. the runner, a `backend.SpeakerEmbeddingBackend`: `ort.py` (CPU onnxruntime session, the
   fallback), `torch_backend.py` (campplus.onnx weights in the in-tree network of `speaker_embedding/campplus/`),
   `trt.py` (TensorRT on CUDA), `graphed.py` (the torch one replayed from device graphs: built only for the
   request `"graphed"`, the stage option `token2wav_spk_backend: graphed`; `auto` never picks it; the device
   check times it directly).

Nothing is imported here: importing the package must not load onnxruntime, TensorRT or the network.
Design notes: docs/design/speaker_embedding.md.
"""
