# SPDX-License-Identifier: Apache-2.0
"""The serving benchmark's prompts per concurrency level (bench/levels.py) and the prefix-cache reset before each
wave (serve/server.py `Server.reset_prefix_cache`, against a local HTTP endpoint that answers as vLLM's does)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from vllm_dflash.bench import levels


def test_num_prompts_is_one_number_or_one_per_level():
    assert levels.parse_num_prompts("32", [1, 8, 32]) == {1: 32, 8: 32, 32: 32}
    assert levels.parse_num_prompts(16, [1, 8]) == {1: 16, 8: 16}
    assert levels.parse_num_prompts("32,72,96", [1, 8, 32]) == {1: 32, 8: 72, 32: 96}
    with pytest.raises(ValueError, match="--num-prompts.*one per concurrency level"):
        levels.parse_num_prompts("32,72", [1, 8, 32])
    with pytest.raises(ValueError, match="--num-prompts 'x'.*whole number"):
        levels.parse_num_prompts("x", [1])
    with pytest.raises(ValueError, match="--num-prompts"):
        levels.parse_num_prompts("0", [1])


def test_a_run_holds_waves_times_the_concurrency():
    counts = levels.prompts_per_run([1, 8, 32], {1: 32, 8: 32, 32: 32}, waves=3)
    assert counts == {1: 32, 8: 32, 32: 96}  # c8: 3 x 8 = 24 < 32 keeps 32; c32: one wave would be 32
    assert levels.prompts_per_run([1, 8, 32], {1: 32, 8: 32, 32: 32}, waves=1) == {1: 32, 8: 32, 32: 32}
    with pytest.raises(ValueError, match="--waves 0"):
        levels.prompts_per_run([1], {1: 4}, waves=0)


def test_levels_share_the_first_prompts_and_the_warm_up_lies_outside():
    counts = {1: 32, 8: 72, 32: 96}
    sl = levels.level_slices(counts)
    assert [(s.start, s.stop) for s in sl.values()] == [(0, 32), (0, 72), (0, 96)]
    assert levels.prompts_needed(counts) == 97  # prompt 96 is the warm-up, in no slice


def test_interleave_rounds_keep_waves_times_the_concurrency():
    assert levels.interleave_rounds(32, 1, 4) == 4
    assert levels.interleave_rounds(32, 8, 4) == 4
    assert levels.interleave_rounds(32, 32, 4) == 1  # a round of fewer than 32 prompts would not hold c32
    assert levels.interleave_rounds(24, 8, 4) == 3
    assert levels.interleave_rounds(5, 8, 4) == 1
    assert levels.interleave_rounds(72, 8, 3, waves=3) == 3  # rounds of 24 = 3 waves of 8
    assert levels.interleave_rounds(32, 8, 3, waves=3) == 1  # rounds of 10-11 would drain after 1.3 waves
    assert levels.interleave_rounds(96, 32, 3, waves=3) == 1


class _Endpoint(BaseHTTPRequestHandler):
    answers: list = []  # per POST: (status, body) popped in order
    calls = 0

    def do_POST(self):  # noqa: N802 - http.server's name
        type(self).calls += 1
        status, body = type(self).answers.pop(0)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    httpd = HTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Endpoint.calls = 0
    yield httpd
    httpd.shutdown()


def _server(httpd):
    from vllm_dflash.serve.server import Server

    return Server("unused", port=httpd.server_address[1])


def test_prefix_cache_reset_retries_while_blocks_are_held(endpoint):
    _Endpoint.answers = [(200, {"success": False}), (200, {"success": True})]
    _server(endpoint).reset_prefix_cache()
    assert _Endpoint.calls == 2
    _Endpoint.answers = [(200, {"success": False})] * 3
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache 3 times"):
        _server(endpoint).reset_prefix_cache(attempts=3)


def test_prefix_cache_reset_without_dev_mode_names_the_fix(endpoint):
    _Endpoint.answers = [(404, {"detail": "Not Found"})]
    with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):
        _server(endpoint).reset_prefix_cache()


def test_each_configuration_starts_in_turn():
    names = ["none", "ngram", "ours"]
    assert levels.rotation(names, 0) == names
    assert levels.rotation(names, 1) == ["ngram", "ours", "none"]
    assert levels.rotation(names, 5) == ["ours", "none", "ngram"]
    assert levels.rotation([], 3) == []
    # a level in one round (c32) after two levels of three rounds starts with the configuration whose turn it is
    assert levels.rotation(names, 3 + 3)[0] == "none" and levels.rotation(names, 3 + 3 + 1)[0] == "ngram"
