#!/usr/bin/env bash
# One GPU session (the `device` tool's H200, a few minutes): the CUDA path checked end to end, then a
# model pair trained on the GPU from the same corpus and tokenizer as the embedded default pair:
# a copy-augmented target of the default shape with the early-exit loss, its distilled draft
# (induction bootstrap, greedy + sampled generations, KL + TV) and its self-draft. Stages are
# bounded by `timeout`; each one's output lands in $OUT whatever the next one does.
#
#   OUT=/tmp/out CHECK_ARGS="--device cpu --prompts 2 --tokens 16 --repeats 1" DEVICE=cpu \
#     BATCH=4 SELF_BATCH=4 TARGET_MIN=0.2 DRAFT_MIN=0.2 SELF_MIN=0.1 \
#     INDUCTION=20 GENERATIONS=16 bash scripts/gpu_session.sh   # dry run
set -u
OUT=${OUT:?set OUT to a folder for the results}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; esac  # the check runs from docs/bench
RUNS=${RUNS:-runs/gpu}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
train() { timeout "$1" "$PY" -m quickdraft.train.cli "${@:2}"; }

mkdir -p "$RUNS" "$OUT"
{ nvidia-smi -L 2>/dev/null; "$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } \
  >"$OUT/env.txt" 2>&1
(cd docs/bench && timeout "${CHECK_S:-120}" "$PY" cuda_check.py --out "$OUT/cuda_check.json" ${CHECK_ARGS:---device $DEVICE --prompts 4 --tokens 48 --repeats 2}) \
  >"$OUT/cuda_check.log" 2>&1
echo "check rc=$?" >>"$OUT/env.txt"

{
  train "${TARGET_S:-200}" target --data data/corpus --tokenizer src/quickdraft/assets/target --out "$RUNS/target" \
    --device "$DEVICE" --batch-size ${BATCH:-64} --lr 2e-3 --warmup-steps 100 --max-steps ${TARGET_STEPS:-1000} \
    --max-minutes "${TARGET_MIN:-2.75}" --checkpoint-minutes 0.1 --copy-fraction 0.5 --exit-layer 2 &&
  train "${DRAFT_S:-130}" draft --data data/corpus --target "$RUNS/target/final" --out "$RUNS/draft" \
    --device "$DEVICE" --batch-size ${BATCH:-64} --lr ${DRAFT_LR:-3e-3} --warmup-steps 20 --max-steps 100000 ${DRAFT_INIT:+--init-from $DRAFT_INIT} --max-minutes "${DRAFT_MIN:-1.25}" \
    --checkpoint-minutes 0.5 --copy-fraction 0.5 --induction-steps "${INDUCTION:-800}" \
    --generations "${GENERATIONS:-1024}" --sampled-generations "${GENERATIONS:-1024}" --generated-fraction 0.5 \
    --tv-weight 1 &&
  train "${SELF_S:-70}" self-draft --data data/corpus --target "$RUNS/target/final" --out "$RUNS/self_draft" \
    --device "$DEVICE" --batch-size ${SELF_BATCH:-32} --max-minutes "${SELF_MIN:-0.6}" --checkpoint-minutes 0.5 \
    --exit-layer 1 --adapter-layers 1 --head-tokens 2048 --generations 512
  echo "train rc=$?"
} >"$OUT/train.log" 2>&1

# What came out, in pieces under $OUT's 16 MiB a file: the pair as `install` lays it out (target
# in bf16), plus every stage's summary and history.
if [ -d "$RUNS/target/final" ] && [ -d "$RUNS/draft/final" ]; then
  self=(); [ -f "$RUNS/self_draft/self_draft.json" ] && self=(--self-draft "$RUNS/self_draft")
  train 60 install --target "$RUNS/target/final" --draft "$RUNS/draft/final" "${self[@]}" --dest "$RUNS/pair" \
    >>"$OUT/train.log" 2>&1
fi
tar czf "$RUNS/pair.tgz" "$RUNS"/pair "$RUNS"/*/summary.json "$RUNS"/*/history.json 2>>"$OUT/train.log"
split -b 15M "$RUNS/pair.tgz" "$OUT/pair.tgz.part-"
ls -la "$OUT"
