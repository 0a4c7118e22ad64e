# SPDX-License-Identifier: Apache-2.0
"""docs/CONTRACTS.md == the tables rendered from vllm_dflash/integration/seam.py, and the table is well formed: every
patch of the ledger has its row and a test that exists (no vLLM import: seam.py imports vLLM only inside check())."""
import importlib.util
from pathlib import Path

from vllm_dflash.integration import seam
from vllm_dflash.integration.patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]


def test_contracts_doc_is_current():
    doc = ROOT / seam.DOC
    text = doc.read_text()
    assert seam.update_doc(text) == text, f"{seam.DOC} is stale. Regenerate it: {seam.REGENERATE}"


def test_table_is_well_formed():
    for c in seam.CONTRACTS:
        assert c.kind in seam.KINDS and c.scope in seam.SCOPES, c
        module, _, qual = c.symbol.partition(":")
        assert module and (c.kind == "module") == (not qual), c.symbol
        assert c.ours and c.use and c.contract, c.symbol
        assert (c.params is not None) <= (c.kind in ("function", "method")), c.symbol
        assert not c.methods or c.kind == "class", c.symbol
        for t in filter(None, c.test.split(", ")):
            assert (ROOT / t.split("::")[0]).is_file(), (c.symbol, t)
        if c.patch:
            assert importlib.util.find_spec(f"vllm_dflash.integration.patches.{c.patch}"), c.patch


def test_every_patch_has_a_row_and_a_test():
    rows = {c.patch: c for c in seam.CONTRACTS if c.patch}
    for p in PATCHES:
        name = p.apply.__module__.rsplit(".", 1)[-1]
        assert name in rows, f"patch {name}: no row with patch={name!r} in vllm_dflash/integration/seam.py CONTRACTS"
        assert p.symbol.split()[0] == rows[name].dotted, (p.symbol, rows[name].dotted)
        assert rows[name].test, f"patch {name}: its row names no test showing why it is needed"
    assert len(rows) == len(PATCHES), "a row names a patch that is not in PATCHES"
