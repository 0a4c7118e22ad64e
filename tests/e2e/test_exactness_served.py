# SPDX-License-Identifier: Apache-2.0
"""Greedy exactness served (split from tests/unit/test_exactness.py, which checks the helpers without vLLM): our
drafter behind `vllm serve` vs the target alone, every difference explained as a bf16 near-tie. The test forces
bfloat16 on whichever CPU runs it (every other vLLM test runs float32), so both dtype paths are exercised on
AVX2-only and on avx512_bf16 machines."""
import pytest

from vllm_dflash import exactness as ex
from vllm_dflash.exactness import summarize, verdict_line

PROMPTS = ["def parse_args(argv):\n    ", "import os\nimport sys\n\nclass Config:", "for i in range(10):\n    print(",
           "The quick brown fox", "x = [1, 2, 3]\ny = ", "class Node:\n    def __init__(self"]


@pytest.mark.vllm
def test_bf16_divergences_are_near_ties(pair, tmp_path):
    """bfloat16, forced: greedy outputs with our drafter (served, 6 concurrent requests) vs the target alone
    (offline, no speculation). Every difference must be explained as a near-tie by the served target's own top-2
    margin; a doctored output (a low-probability token swapped in) must be flagged as a real difference."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI
    from transformers import AutoTokenizer

    from vllm_dflash.serve.server import Server
    from support.vllm_helpers import run_vllm

    target = str(pair / "target")
    (base,) = run_vllm([{"model": target, "prompts": PROMPTS, "max_tokens": 32, "llm_kwargs": {"dtype": "bfloat16"}}])
    spec = {"method": "dflash", "model": str(pair / "draft-b8"), "num_speculative_tokens": 7}
    tok = AutoTokenizer.from_pretrained(target)
    with Server(target, speculative_config=spec, dtype="bfloat16", max_model_len=1024,
                log_path=str(tmp_path / "serve.log"), env={"OMP_NUM_THREADS": "1"}).start(timeout=400) as srv:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none")
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(lambda p: client.completions.create(
                model="target", prompt=p, max_tokens=32, temperature=0, extra_body={"ignore_eos": True}).choices[0].text,
                PROMPTS))
        divs = [d for p, a, b in zip(PROMPTS, base["texts"], texts)
                if (d := ex.explain(srv.url, tok, {"prompt": p}, a, b, "bfloat16"))]
        s = summarize(len(PROMPTS), divs, "bfloat16")
        assert s["passed"], verdict_line(s)
        assert all(ex.is_near_tie(d["margin"], "bfloat16") for d in s["divergences"])
        # negative control: the served target's least likely of its top-20 tokens at position 3, swapped in
        ids = tok.encode(base["texts"][0], add_special_tokens=False)
        prompt_ids = ex.prompt_ids(tok, {"prompt": PROMPTS[0]})
        wrong = min(_top(srv.url, prompt_ids + ids[:3], 20), key=lambda kv: kv[1])[0]  # (a token string)
        doctored = tok.decode(ids[:3]) + wrong + tok.decode(ids[4:])
        d = ex.explain(srv.url, tok, {"prompt": PROMPTS[0]}, base["texts"][0], doctored, "bfloat16")
        assert d is not None and not d.near_tie, d
        # the bench's streaming client gets the server's own token ids (what greedy outputs are compared on)
        from vllm_dflash.bench.client import run_load

        (r,) = run_load(srv.url, [{"id": "a", "messages": [{"role": "user", "content": PROMPTS[3]}]}], 1, 12)
        assert len(r["token_ids"]) == r["completion_tokens"] > 0, r
        assert r["prompt_token_ids"] and len(r["prompt_token_ids"]) == r["prompt_tokens"], r
        assert tok.decode(r["token_ids"], skip_special_tokens=True) == r["text"], r


def _top(url, ids, n):
    import json
    import urllib.request

    body = {"model": "target", "prompt": ids, "max_tokens": 1, "temperature": 0.0, "logprobs": n}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return list(json.loads(r.read())["choices"][0]["logprobs"]["top_logprobs"][0].items())
