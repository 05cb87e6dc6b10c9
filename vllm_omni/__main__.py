# SPDX-License-Identifier: Apache-2.0
"""`python -m vllm_omni` == `vllm-omni`."""

import sys

from vllm_omni.entrypoints.cli.main import main

sys.exit(main())
