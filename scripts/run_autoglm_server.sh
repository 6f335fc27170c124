#!/usr/bin/env bash
# Start AutoGLM-Phone-9B with our recommended settings, after `autoglm-serve doctor` has checked
# the environment (Python, torch and CUDA, the GPU's free memory, Triton, the weights, the port).
#
#   scripts/run_autoglm_server.sh [MODEL_DIR] [extra autoglm-serve flags...]
#
# MODEL_DIR (or $AUTOGLM_MODEL): the downloaded zai-org/AutoGLM-Phone-9B checkpoint.
# Environment: PORT (8000), HOST (0.0.0.0), GPU (0), MAX_MODEL_LEN (25480), PYTHON (the
# repository's .venv made by scripts/setup.sh when there is one, else python3 from PATH).
# Every problem found is printed with how to fix it; the server starts only when there is none.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"

MODEL="${1:-${AUTOGLM_MODEL:-}}"
[ $# -gt 0 ] && shift
PORT="${PORT:-8000}"
HOST="${HOST:-0.0.0.0}"
GPU="${GPU:-0}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-25480}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "✗ no $PYTHON"
    echo "  fix: run scripts/setup.sh (it makes .venv), or set PYTHON=/path/to/python"
    exit 1
fi
if ! "$PYTHON" -c "import autoglm_serve" >/dev/null 2>&1; then
    echo "✗ autoglm_serve is not importable by $PYTHON"
    echo "  fix: run scripts/setup.sh (it makes .venv with everything), or set PYTHON=..."
    exit 1
fi
if [ -z "$MODEL" ]; then
    echo "✗ no model path given"
    echo "  fix: pass the AutoGLM-Phone-9B directory: $0 /models/AutoGLM-Phone-9B (download:" \
         "huggingface-cli download zai-org/AutoGLM-Phone-9B --local-dir /models/AutoGLM-Phone-9B)"
    exit 1
fi

export CUDA_VISIBLE_DEVICES="$GPU"
"$PYTHON" -m autoglm_serve doctor "$MODEL" --host "$HOST" --port "$PORT" || {
    echo "not starting: fix the problems above."
    exit 1
}

# The flags of Open-AutoGLM's vLLM line, plus prefix caching and chunked prefill (agent steps
# resend the system prompt and history) and the GLM reasoning split available per request.
exec "$PYTHON" -m autoglm_serve serve "$MODEL" \
    --served-model-name autoglm-phone-9b \
    --host "$HOST" --port "$PORT" \
    --max-model-len "$MAX_MODEL_LEN" \
    --limit-mm-per-prompt '{"image": 10}' \
    --mm-processor-kwargs '{"max_pixels": 5000000}' \
    --allowed-local-media-path / \
    --enable-prefix-caching --enable-chunked-prefill \
    --gpu-memory-utilization 0.9 \
    "$@"
