#!/usr/bin/env bash
# The depth / training-compute study of issue #15 on CPU: three new drafts (1, 2 and 3 layers) trained from scratch
# on the same data, order and anchors, side by side, one niced thread each. Equal compute: each depth gets the steps
# that cost the same draft-training time, from the measured step time with cached features (`python benchmarks/
# profile_train_step.py --layers 1,2,3 --vocab 8192 --threads 1`; Xeon with AMX, batch 4 x 32, fwd + bwd + AdamW:
# 0.29-0.36 / 0.41-0.48 / 0.59-0.60 s, so 1 : 1.5 : 2; the EPYC measured 1 : 1.5 for two layers), and held-out τ
# every tenth of its schedule, so the three curves share their compute points. The 1-layer run's ten points span
# 10x in training tokens. Resumable: run it again (each run resumes from its checkpoint).
#
#   setsid nohup bash scripts/depth_study.sh > runs/depth-study.log 2>&1 &                # the 1-layer run
#   ONLY="2 3" setsid nohup bash scripts/depth_study.sh >> runs/depth-study.log 2>&1 &    # later: 2 and 3 layers
#   .venv/bin/python dev/studies/scaling_curves.py     # JSON + table + plot into dev/results/scaling_cpu/
# The whole script is one block, read before it runs: editing this file while a study waits cannot change what it
# does next (bash reads a script as it goes; an edit during `wait` once launched a stray run).
{
cd "$(dirname "$0")/.."
DATA=${DATA:-data/collect/smollm2-v1,data/collect/smollm2-v2,data/collect/smollm2-gpu1,data/collect/smollm2-gpu2,data/collect/smollm2-gpu3}
STEPS1=${STEPS1:-1000}                 # the 1-layer schedule; the others get STEPS1 / relative step cost
COST=${COST:-"1:1.0 2:1.5 3:2.0"}    # layers:relative step cost
PREFIX=${PREFIX:-runs/depth}
# Every run trains on the same records: a snapshot of the collection parts (symlinks) taken at the first start, so a
# collection running meanwhile (or a resumed run re-reading its folders) changes neither the data nor its order.
# The study of session 13 read smollm2-v2 up to part 223 (29,220 training sequences, 6,289,362 response tokens):
# MAX_PART pins that, so the same study can be rerun on another machine; MAX_PART= takes every part present.
SNAP=${SNAP:-$PREFIX-data}
MAX_PART=${MAX_PART-smollm2-v2:223}
if [ ! -d "$SNAP" ]; then
  for f in ${DATA//,/ }; do
    for src in "$f" "$f"/shard-*; do
      [ -d "$src" ] || continue
      dst="$SNAP/$(basename "$f")${src#"$f"}"
      mkdir -p "$dst"
      for p in "$src"/part-*; do
        [ -e "$p" ] || continue
        n=$(basename "$p"); n=${n#part-}; n=$((10#${n%%.*}))
        [ -n "$MAX_PART" ] && [ "$(basename "$f")" = "${MAX_PART%%:*}" ] && [ "$n" -gt "${MAX_PART#*:}" ] && continue
        ln -s "$(realpath "$p")" "$dst/"
      done
    done
  done
fi
DATA=$(for f in ${DATA//,/ }; do printf '%s,' "$SNAP/$(basename "$f")"; done); DATA=${DATA%,}
# Uncached target features cost ~2.5 s per step on one thread, ~7x a cached draft step: runs started together
# compute the same features side by side. So by default only the 1-layer run starts; it fills the feature cache, and
# ONLY="2 3" started once it is ahead (or finished) runs the deeper drafts on cached features.
ONLY=${ONLY:-1}
THREADS=${THREADS:-1}   # torch threads per run (the 1-layer run alone: 2 fills the cache about twice as fast)
for lc in $COST; do
  L=${lc%%:*} c=${lc#*:}
  case " $ONLY " in *" $L "*) ;; *) continue ;; esac
  steps=$(python3 -c "print(round($STEPS1 / $c))")
  every=$(python3 -c "print(max(1, round($steps / 10)))")
  mkdir -p "$PREFIX-l$L"
  # each run its own session (and scheduler autogroup, lowered: niced against other work, equal among themselves)
  OMP_NUM_THREADS=$THREADS setsid bash -c "echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 15 .venv/bin/vllm-dflash train \
    --data '$DATA' --out '$PREFIX-l$L' --feature-cache runs/features/smollm2 --layers $L --block-size 8 \
    --batch-size 4 --anchors 32 --lr 6e-4 --epochs 1 --max-steps $steps --eval-every $every --ckpt-every 100 \
    --threads $THREADS" >> "$PREFIX-l$L.log" 2>&1 &
  echo "layers $L: $steps steps, held-out τ every $every (pid $!)"
done
wait
exit
}
