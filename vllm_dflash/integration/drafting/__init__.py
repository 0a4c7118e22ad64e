# SPDX-License-Identifier: Apache-2.0
"""How our drafter drafts, one strategy per mode (integration/proposer.py `DFlashDrafter` owns vLLM's seam and hands
each `propose` to its strategy):

- mode.py: the drafting mode of an engine (`drafting_mode`), resolved once from its frozen settings; read by the
  drafter, the async scheduler and the patches. Imports neither vLLM nor torch.
- fixed.py (`FixedBlock`), adaptive.py (`AdaptiveDrafting`, synchronous), overlap.py (`OverlapDrafting`): the
  strategies.
- step.py (`DraftStep`): one call of `propose`, and the draft forward over it; denoise.py: the denoising passes;
  block_sampling.py: drafts drawn from the draft's marginals and their q for the verifier; hints.py: a hinted draft's
  block inputs; plan.py: the step's decoding rows and plan (frozen dataclasses).

This package's __init__ imports nothing: mode.py is read where vLLM is not imported."""
