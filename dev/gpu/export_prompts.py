# SPDX-License-Identifier: Apache-2.0
"""Write the not-yet-collected prompt items of a collection folder as one xz-compressed JSONL (for a machine that
lacks the source packages): `python dev/gpu/export_prompts.py data/collect/smollm2-v2 .gpu/prompts.jsonl.xz [EXCLUDE_DIR ...]`.
Prompts that the EXCLUDE_DIR collections (an earlier GPU run, say) already answered are left out too."""
import json
import lzma
import sys
from pathlib import Path

from vllm_dflash.data.collect import CollectConfig, _frozen_prompts, collected_ids

folder, out = sys.argv[1], sys.argv[2]
man = json.loads((Path(folder) / "manifest.json").read_text())
cfg = CollectConfig(**{**man["config"], "sources": tuple(man["config"]["sources"]), "shard": (0, 1)})
done = set(man["done_ids"]) | set(man.get("skipped_ids", [])) | collected_ids(sys.argv[3:])
items = [it for it in _frozen_prompts(cfg) if it["id"] not in done]
Path(out).parent.mkdir(parents=True, exist_ok=True)
with lzma.open(out, "wt", preset=9) as f:
    for it in items:
        f.write(json.dumps(it) + "\n")
print(f"{len(items)} items ({len(done)} already collected) -> {out}: {Path(out).stat().st_size / 1e6:.1f} MB")
