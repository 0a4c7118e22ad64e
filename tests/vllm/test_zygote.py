# SPDX-License-Identifier: Apache-2.0
"""The test harness's vLLM zygote (tests/support/vllm_zygote.py): a run forked from it is the process a fresh
`python vllm_run.py` would be (same environment, same working directory, no plugin loaded before the run asks for
one, same tokens), and runs that set load-time variables or build multi-process / compiled engines get a new
interpreter."""
import os

import pytest

from support.vllm_helpers import BASE_ENV, run_vllm
from support.vllm_zygote import needs_fresh_process

pytestmark = pytest.mark.vllm

_PROBE = ("import os, sys\n"
          "probe['env'] = {k: v for k, v in os.environ.items()\n"
          "                if k.startswith(('DFLASH_TEST_ZMARK', 'VLLM_PLUGINS'))}\n"
          "probe['cwd'] = os.getcwd()\n"
          "probe['pid_is_session_leader'] = os.getsid(0) == os.getpid()\n"
          "probe['pre_plugin'] = sorted(os.environ.get('DFLASH_TEST_ZMODS', '').split())\n")
# before the LLM is built: which plugin modules the process already holds (none, in a fresh process)
_PATCH = ("import os, sys\n"
          "os.environ['DFLASH_TEST_ZMODS'] = ' '.join(m for m in sys.modules if m.startswith('vllm_dflash'))\n")


def test_forked_run_is_a_fresh_process(pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = {"model": str(pair / "target"), "prompts": [[5, 6, 7, 8] * 6], "max_tokens": 12, "after": _PROBE,
           "patch": _PATCH, "speculative_config": {"method": "dflash", "model": str(pair / "draft-b8")}}
    env = {"DFLASH_TEST_ZMARK": "forked"}
    forked = run_vllm([run], env=env)[0]
    monkeypatch.setenv("DFLASH_TEST_ZYGOTE", "0")
    fresh = run_vllm([run], env={**env, "DFLASH_TEST_ZMARK": "fresh"})[0]
    assert forked["probe"]["env"] == {"DFLASH_TEST_ZMARK": "forked"}, forked["probe"]
    assert fresh["probe"]["env"] == {"DFLASH_TEST_ZMARK": "fresh"}, fresh["probe"]
    assert forked["probe"]["cwd"] == fresh["probe"]["cwd"] == str(tmp_path)
    assert forked["probe"]["pid_is_session_leader"]  # a timed-out run is killed with all it started
    assert forked["probe"]["pre_plugin"] == fresh["probe"]["pre_plugin"] == []  # the zygote loads no plugin
    assert forked["tokens"] == fresh["tokens"]
    assert forked["first_counters"]["vllm:spec_decode_num_draft_tokens"] > 0  # the plugin loaded in the child


def test_load_time_settings_get_a_new_interpreter():
    base = {**os.environ, **BASE_ENV}
    plain = [{"model": "m", "prompts": []}]
    assert not needs_fresh_process(plain, {**base, "DFLASH_ADAPTIVE": "0", "VLLM_PLUGINS": ""}, base)
    assert needs_fresh_process(plain, {**base, "OMP_NUM_THREADS": "2"}, base)
    assert needs_fresh_process(plain, {**base, "LD_PRELOAD": "x.so"}, base)
    assert needs_fresh_process(plain, {**base, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, base)
    assert needs_fresh_process([{**plain[0], "llm_kwargs": {"enforce_eager": False}}], base, base)
    assert needs_fresh_process([{**plain[0], "llm_kwargs": {"distributed_executor_backend": "mp"}}], base, base)
    assert needs_fresh_process([{**plain[0], "env": {"OMP_NUM_THREADS": "2"}}], base, base)
