#!/usr/bin/env bash
# Start AutoGLM-Phone-9B with our recommended settings, after checking the environment.
#
#   scripts/run_autoglm_server.sh [MODEL_DIR] [extra autoglm-serve flags...]
#
# MODEL_DIR (or $AUTOGLM_MODEL): the downloaded zai-org/AutoGLM-Phone-9B checkpoint.
# Environment: PORT (8000), HOST (0.0.0.0), GPU (0), PYTHON (python3), MAX_MODEL_LEN (25480),
# MIN_FREE_GIB (24: 17.6 GB of bf16 weights plus room for the KV cache and activations).
# Every problem found is printed with how to fix it; the server starts only when there is none.
set -u

MODEL="${1:-${AUTOGLM_MODEL:-}}"
[ $# -gt 0 ] && shift
PORT="${PORT:-8000}"
HOST="${HOST:-0.0.0.0}"
GPU="${GPU:-0}"
PYTHON="${PYTHON:-python3}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-25480}"
MIN_FREE_GIB="${MIN_FREE_GIB:-24}"
problems=0

fail() { echo "✗ $1"; echo "  fix: $2"; problems=$((problems + 1)); }
ok() { echo "✓ $1"; }

# 1. Python and the package.
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    fail "no $PYTHON on PATH" "install Python >= 3.11, or set PYTHON=/path/to/python"
elif ! "$PYTHON" -c "import autoglm_serve" >/dev/null 2>&1; then
    fail "autoglm_serve is not importable by $PYTHON" \
         "pip install -e '.[gpu]' in the repository (or activate its virtualenv)"
else
    ok "autoglm_serve found ($("$PYTHON" -c 'import autoglm_serve; print(autoglm_serve.__version__)'))"
fi

# 2. The NVIDIA driver, the GPU, its free memory.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail "nvidia-smi not found: no NVIDIA driver" \
         "install the NVIDIA driver (>= 535 for CUDA 12) and reboot; check with nvidia-smi"
else
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i "$GPU" 2>/dev/null | head -1)
    if [ -z "$driver" ]; then
        fail "nvidia-smi cannot see GPU $GPU" "check nvidia-smi -L and set GPU=<index>"
    else
        name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$GPU" | head -1)
        free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i "$GPU" | head -1)
        ok "GPU $GPU: $name, driver $driver, $((free_mib / 1024)) GiB free"
        if [ "$((free_mib / 1024))" -lt "$MIN_FREE_GIB" ]; then
            fail "only $((free_mib / 1024)) GiB free on GPU $GPU (need about $MIN_FREE_GIB)" \
                 "stop the other processes on it (nvidia-smi lists them), pick another GPU=..., or lower MAX_MODEL_LEN"
        fi
    fi
fi

# 3. CUDA as PyTorch sees it.
if command -v "$PYTHON" >/dev/null 2>&1; then
    cuda=$(CUDA_VISIBLE_DEVICES="$GPU" "$PYTHON" -c \
        "import torch; print(torch.version.cuda or 'none', torch.cuda.is_available())" 2>/dev/null)
    case "$cuda" in
        *True) ok "PyTorch CUDA ${cuda% *} available" ;;
        none*) fail "this PyTorch is a CPU-only build" \
                    "pip install torch --index-url https://download.pytorch.org/whl/cu128" ;;
        *) fail "PyTorch cannot use CUDA (${cuda:-torch not importable})" \
                "match the driver and the CUDA build of torch (nvidia-smi shows the highest CUDA the driver supports)" ;;
    esac
fi

# 4. The weights.
if [ -z "$MODEL" ]; then
    fail "no model path given" \
         "pass the AutoGLM-Phone-9B directory: $0 /models/AutoGLM-Phone-9B (download: huggingface-cli download zai-org/AutoGLM-Phone-9B --local-dir /models/AutoGLM-Phone-9B)"
elif [ ! -f "$MODEL/config.json" ]; then
    fail "$MODEL has no config.json" "point to the checkpoint directory (the one with config.json and *.safetensors)"
elif ! ls "$MODEL"/*.safetensors >/dev/null 2>&1; then
    fail "$MODEL has no *.safetensors weights" \
         "the download is incomplete: rerun huggingface-cli download zai-org/AutoGLM-Phone-9B --local-dir $MODEL"
else
    ok "weights in $MODEL ($(du -sh "$MODEL" 2>/dev/null | cut -f1))"
fi

# 5. The port.
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" - "$HOST" "$PORT" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
EOF
then
    fail "port $PORT on $HOST is in use" "stop what listens there (ss -ltnp | grep :$PORT) or set PORT=..."
else
    ok "port $PORT is free"
fi

if [ "$problems" -gt 0 ]; then
    echo "$problems problem(s): not starting."
    exit 1
fi

# The flags of Open-AutoGLM's vLLM line, plus prefix caching and chunked prefill (agent steps
# resend the system prompt and history) and the GLM reasoning split available per request.
export CUDA_VISIBLE_DEVICES="$GPU"
exec "$PYTHON" -m autoglm_serve.cli serve "$MODEL" \
    --served-model-name autoglm-phone-9b \
    --host "$HOST" --port "$PORT" \
    --max-model-len "$MAX_MODEL_LEN" \
    --limit-mm-per-prompt '{"image": 10}' \
    --mm-processor-kwargs '{"max_pixels": 5000000}' \
    --allowed-local-media-path / \
    --enable-prefix-caching --enable-chunked-prefill \
    --gpu-memory-utilization 0.9 \
    "$@"
