# SPDX-License-Identifier: Apache-2.0
"""Statistics shared by the sampling tests (tests/unit/test_reference.py, tests/vllm/test_vllm_sampling.py): the
package's two-sample chi-square (vllm_dflash/bench/chi2.py), which the served mixed-source check uses too."""
from vllm_dflash.bench.chi2 import chi2_two_sample_pvalue  # noqa: F401 (re-exported)
