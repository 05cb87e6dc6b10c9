# SPDX-License-Identifier: Apache-2.0
"""`python -m vllm_omni_token2wav` == `vllm-omni-token2wav`."""

import sys

from vllm_omni_token2wav.entrypoints.cli.main import main

sys.exit(main())
