# SPDX-License-Identifier: Apache-2.0
"""The record types of the seam table (integration/contracts.py, integration/contracts_ray.py): a contract on one vLLM
symbol and the method signatures it names. Data only; imports neither vLLM nor torch."""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("module", "class", "function", "method", "attribute")
# serve: needed to run DFlash (checked at registration: a problem disables DFlash); ray: RayCpuExecutor's internals
# (used only with backend "ray" on CPU; importing them imports ray, too slow for every process); tests: read by tests
# and benchmarks only. ray and tests are checked by `--check` and tests/vllm/test_seam.py, never at registration.
SCOPES = ("serve", "ray", "tests")


@dataclass(frozen=True)
class Sig:
    """A method of a class contract: its parameter names (self / cls dropped). exact: we override or replace it with
    a function of our own (the names must match one for one); otherwise we call it (our names must still be
    parameters, in this order, and any new parameter must be optional)."""

    name: str
    params: tuple[str, ...]
    exact: bool = False


@dataclass(frozen=True)
class Contract:
    symbol: str  # "module" or "module:Qual.name" (rendered dotted)
    kind: str  # one of KINDS
    ours: str  # our file(s) relying on it
    use: str  # how we use it
    contract: str  # what we rely on
    params: tuple[str, ...] | None = None  # function / method: parameter names (self / cls dropped)
    exact: bool = False  # params must match one for one (we override / replace it)
    methods: tuple[Sig, ...] = ()  # class: methods we call or override
    # members that must exist: on a class (class attribute, property, dataclass field, or `self.<name>` assigned in a
    # method of the class or a vLLM base class); on a method's class; on a module or an object
    attrs: tuple[str, ...] = ()
    source: tuple[str, ...] = ()  # text that must appear in the function's source (else in its module's source)
    patch: str | None = None  # the module in integration/patches/ that patches it (the ledger)
    test: str = ""  # the test that shows the contract holds / why the patch is needed
    scope: str = "serve"

    @property
    def dotted(self) -> str:
        return self.symbol.replace(":", ".")
