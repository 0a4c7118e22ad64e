#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Where does a DFlash training step spend its time on this machine? (target features vs draft vs output layer)

    python benchmarks/profile_train_step.py --data data/collect/smollm2-v1
        [--out benchmarks/results/profile_train_step.json]

The logic lives in vllm_dflash/bench/train_profile.py (also `python -m vllm_dflash.bench.train_profile`)."""
from vllm_dflash.bench.train_profile import main

if __name__ == "__main__":
    main()
