# SPDX-License-Identifier: Apache-2.0
"""Every patch's install-time check passes against the installed vLLM / vLLM-Omni, and install / uninstall work.

The stand-in tests (`test_register.py`, `worker/test_patch_generation_scheduler.py`) prove the checks can
fail; this one proves they accept the engine this repository pins (vLLM 0.30.0, vLLM-Omni 0.30.0), so the
plugin still starts. Runs in a subprocess: the patches touch process-global upstream objects.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.engine import require_engine

pytestmark = [pytest.mark.core_model, pytest.mark.cpu, pytest.mark.engine]

require_engine("the patches' checks against the installed upstream")

_SCRIPT = """
import json
import vllm_omni.engine.arg_utils as arg_utils
from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm_omni_token2wav.patch.platform import patch_omni_model_registration as registration
from vllm_omni_token2wav.patch.worker import patch_cuda_graph_wrapper as cuda, patch_generation_scheduler as sched
from vllm_omni_token2wav.patch.worker import patch_latency_planning as planning
from vllm_omni_token2wav.platforms.graph_capture_guard import is_guarded

report = {}
stock_update = OmniGenerationScheduler.update_from_output
sched.check_upstream(OmniGenerationScheduler)
sched.install(); sched.install()
report["sched_wrapped_once"] = OmniGenerationScheduler.update_from_output.__wrapped__ is stock_update
sched.uninstall()
report["sched_restored"] = OmniGenerationScheduler.update_from_output is stock_update

stock_schedule = OmniGenerationScheduler.schedule
planning.check_upstream(OmniGenerationScheduler)
planning.install(); planning.install()
report["planning_wrapped_once"] = OmniGenerationScheduler.schedule.__wrapped__ is stock_schedule
planning.uninstall()
report["planning_restored"] = OmniGenerationScheduler.schedule is stock_schedule

calls = []
stock_register = arg_utils.register_omni_models_to_vllm
registration.install(lambda: calls.append("ours")); registration.install(lambda: calls.append("twice"))
arg_utils.register_omni_models_to_vllm()
report["reregistered_after_upstream"] = calls
registration.uninstall()
report["registration_restored"] = arg_utils.register_omni_models_to_vllm is stock_register

cuda.install()
report["cuda_guarded"] = is_guarded(CUDAGraphWrapper.__call__)
cuda.uninstall()
report["cuda_restored"] = not is_guarded(CUDAGraphWrapper.__call__)
print(json.dumps(report))
"""


def test_each_patch_installs_against_the_installed_upstream_and_uninstalls() -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {
        "sched_wrapped_once": True,
        "sched_restored": True,
        "planning_wrapped_once": True,
        "planning_restored": True,
        "reregistered_after_upstream": ["ours"],
        "registration_restored": True,
        "cuda_guarded": True,
        "cuda_restored": True,
    }
