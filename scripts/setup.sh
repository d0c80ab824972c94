#!/usr/bin/env bash
# Creates the virtual environment and installs dlx with its test extra.
# torch is installed only when the environment lacks it, pinned to $TORCH_VERSION (2.13.0, a CPU build, by default);
# every later install runs under a constraints file that holds the torch already present, so nothing replaces it.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION"
    "$PY" -m pip install --quiet "torch==$TORCH_VERSION"
fi
constraints="$VENV/torch-constraints.txt"
"$PY" -c "import torch; print('torch==' + torch.__version__)" > "$constraints"
echo "setup: keeping $(cat "$constraints")"
# DeepSpeed (test extra) builds no CUDA/C++ ops at install time; the ones it needs are built on first use
DS_BUILD_OPS=0 "$PY" -m pip install --quiet -c "$constraints" -e ".[test]"
