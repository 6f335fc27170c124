#!/usr/bin/env bash
# Our server and `transformers serve --continuous-batching` on the same CPU, the same model
# (the embedded SmolLM2-135M-Instruct; a safetensors copy of its GGUF for transformers) and the
# same dataset, measured with `autoglm-serve bench serve` one server at a time, then drawn on one
# plot and one table with `autoglm-serve bench compare`. transformers runs twice: in the
# checkpoint's float32 and in bfloat16 (our default on a CPU with native bf16), with a KV
# cache of 32k tokens (its default sizes the cache to the free memory: 14 GB here, and it was
# killed for memory while another process held 9 GB); ours is 2 GiB.
#     [PY=path/to/python] scripts/bench_cpu_compare.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench_out/cpu_compare}
PY=${PY:-.venv/bin/python}
TRANSFORMERS=$(dirname "$PY")/transformers
export HF_HUB_OFFLINE=1   # never look a name up on a hub
mkdir -p "$OUT"
COPY="$OUT/smollm2-safetensors"
[ -f "$COPY/config.json" ] || $PY -c "
import sys; sys.path.insert(0, 'scripts')
from pathlib import Path; from bench_cpu_server import safetensors_copy
safetensors_copy(Path('$COPY'))"
BENCH=(--dataset random --num-prompts 48 --input-len 64 --output-len 48 --temperature 0
       --max-concurrency 1,4,16 --seed 0 --tokenizer "$COPY")

wait_health() {
  for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done
  echo "server at $1 did not come up" >&2; return 1
}

$PY -m autoglm_serve serve --port 8101 --host 127.0.0.1 --served-model-name smollm2 \
    --max-model-len 2048 > "$OUT/ours.log" 2>&1 &
PID=$!
wait_health http://127.0.0.1:8101
$PY -m autoglm_serve bench serve --base-url http://127.0.0.1:8101 --model smollm2 "${BENCH[@]}" \
    --label autoglm-serve --out "$OUT/autoglm-serve" --no-progress
kill -TERM $PID 2>/dev/null || true; wait $PID || true

for DTYPE in float32 bfloat16; do
  "$TRANSFORMERS" serve "$COPY" --continuous-batching --port 8102 --host 127.0.0.1 \
      --device cpu --dtype $DTYPE --cb-block-size 32 --cb-num-blocks 1024 > "$OUT/transformers-$DTYPE.log" 2>&1 &
  PID=$!
  wait_health http://127.0.0.1:8102
  $PY -m autoglm_serve bench serve --base-url http://127.0.0.1:8102 --model "$COPY" "${BENCH[@]}" \
      --label "transformers serve $DTYPE" --out "$OUT/transformers-$DTYPE" --no-progress
  kill -TERM $PID 2>/dev/null || true; wait $PID || true
done

$PY -m autoglm_serve bench compare "$OUT/autoglm-serve" "$OUT/transformers-float32" \
    "$OUT/transformers-bfloat16" --out "$OUT/compare"
