# SPDX-License-Identifier: Apache-2.0
"""A folder `bench token2wav-serve --engine --edge` puts first on the served engine's `PYTHONPATH`.

It is a package only so that a wheel ships its `sitecustomize.py` (which see); nothing imports it as
`vllm_omni_token2wav...transfer_site`.
"""
