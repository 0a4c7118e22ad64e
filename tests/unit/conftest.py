# SPDX-License-Identifier: Apache-2.0
"""The unit tier never imports vLLM, neither when a test module is imported nor while a test runs (tests that do
belong in tests/vllm or tests/e2e). Enforced here: a unit test module that imports `vllm` fails to collect, and a unit
test that imports it fails at teardown, each naming the offender.

The check sees this process only (a subprocess is not watched), and only while nothing else has imported vLLM yet: in
`bash scripts/test.sh tests/unit` that is every test; in a full run the e2e tier runs first and may import it."""
import sys

import pytest


def _vllm_imported() -> bool:
    return "vllm" in sys.modules


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    before = _vllm_imported()
    outcome = yield
    if isinstance(collector, pytest.Module) and not before and _vllm_imported():
        rep = outcome.get_result()
        rep.outcome = "failed"
        rep.longrepr = (f"{collector.nodeid} imports vllm when it is imported: the unit tier must not. "
                        "Fix: move the test to tests/vllm (or import vLLM-free modules only)")


@pytest.fixture(autouse=True)
def _unit_tests_do_not_import_vllm(request):
    before = _vllm_imported()
    yield
    if not before and _vllm_imported():
        pytest.fail(f"{request.node.nodeid} imported vllm while it ran: the unit tier must not. "
                    "Fix: move the test to tests/vllm (or keep it off code paths that import vLLM)", pytrace=False)
