#!/usr/bin/env bash
# Long-running, resumable training of the SmolLM2 block-8 draft on the growing collection, 1 OpenMP thread, niced.
#
# Rounds: each trains for ROUND_MINUTES (default 40), checkpoints and exits; the next round re-reads the data folders
# (parts a running collection added since join the next epoch) and resumes from runs/$RUN/checkpoint. The loop ends
# when the schedule (--max-steps) is done. Checkpoints also every 500 steps / 5 minutes, so a kill loses little.
#
#   setsid nohup bash scripts/train_bg.sh > runs/smollm2-b8-ft.log 2>&1 &      # start or resume
#   kill -TERM -- -$(cat runs/smollm2-b8-ft/train_bg.pid)                       # stop: checkpoints, then exits
#
# Extra arguments go to every `vllm-dflash train` call (new-run options such as --init-draft matter only the first time).
cd "$(dirname "$0")/.."
# setsid gives this job its own scheduler autogroup, where nice only ranks it against itself: lower the
# group's weight too (Linux autogroup; measured: a "nice 15" job still took a full core from a build).
echo 19 > /proc/self/autogroup 2>/dev/null || true
RUN=${RUN:-smollm2-b8-r3}
DATA=${DATA:-data/collect/smollm2-v1,data/collect/smollm2-v2,data/collect/smollm2-gpu1,data/collect/smollm2-gpu2,data/collect/smollm2-gpu3}
ROUND_MINUTES=${ROUND_MINUTES:-40}
# the lr schedule's horizon: warm-up is 4 % of it, so at the 10-30 s a fine-tuning step takes on 2 cores (feature
# bound), 40,000 steps meant 5-13 hours of warm-up; 3,000 is about 17 hours, a few sessions
MAX_STEPS=${MAX_STEPS:-3000}
LR=${LR:-3e-4}   # fine-tuning lr
BUDGET_MINUTES=${BUDGET_MINUTES:-}   # set: the lr schedule is fitted to this much training time (first round measures the rate)
INIT_DRAFT=${INIT_DRAFT-models/SmolLM2-135M-Instruct-DFlash-b8}   # fine-tune from the bundled draft; INIT_DRAFT= : scratch
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "runs/$RUN"
echo $$ > "runs/$RUN/train_bg.pid"
stop=0 failures=0
trap 'stop=1' TERM INT   # the trainer (same process group) gets the signal too, checkpoints and exits
while [ "$stop" = 0 ]; do
  echo "=== round at $(date -Is)"
  if ! nice -n 15 .venv/bin/vllm-dflash train --data "$DATA" --out "runs/$RUN" --feature-cache runs/features/smollm2 \
      ${INIT_DRAFT:+--init-draft "$INIT_DRAFT"} --lr "$LR" --max-steps "$MAX_STEPS" --epochs 100000 \
      --run-minutes "$ROUND_MINUTES" ${BUDGET_MINUTES:+--time-budget-minutes "$BUDGET_MINUTES"} --threads 1 "$@"; then
    failures=$((failures + 1))  # e.g. killed for memory: resume from the last checkpoint after a pause
    echo "train failed ($failures in a row)"
    [ "$failures" -ge 5 ] && exit 1
    sleep 60
    continue
  fi
  failures=0
  .venv/bin/python -c "import json,sys; sys.exit(0 if json.load(open('runs/$RUN/report.json'))['train']['paused'] else 1)" \
    || break  # schedule finished (or stopped by a signal)
done
echo "=== stopped at $(date -Is)"
