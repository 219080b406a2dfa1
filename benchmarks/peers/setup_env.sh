#!/usr/bin/env bash
# Build the separate virtual environment in which benchmarks/peers/driver.py runs
# NVlabs/Fast-dLLM's own LLaDA code (remote-code modeling_llada.py, which needs transformers 4.x).
#
#   bash benchmarks/peers/setup_env.sh [VENV]          # default VENV: runs/peers-venv (gitignored)
#
# Environment overrides: PYTHON (interpreter to build the venv from, default python3),
# TORCH_VERSION (default 2.13.0; plain PyPI gives the CPU build on a machine without CUDA),
# TRANSFORMERS_VERSION (default 4.57.6, the newest 4.x release Fast-dLLM's LLaDA code runs with
# here; Fast-dLLM pins 4.49.0 in its requirements.txt, which also works).
# Only the packages below are installed; Fast-dLLM itself is not: pass its checkout to
# benchmarks/bench_peers.py with --fastdllm DIR.
set -euo pipefail

VENV="${1:-runs/peers-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.6}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtual environment $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "torch==$TORCH_VERSION"
"$PY" -m pip install --quiet "transformers==$TRANSFORMERS_VERSION" safetensors numpy accelerate einops

"$PY" - <<'PYEOF'
import sys
import accelerate, einops, numpy, safetensors, torch, transformers
print(f"python       {sys.version.split()[0]} ({sys.executable})")
print(f"torch        {torch.__version__} (CUDA available: {torch.cuda.is_available()})")
print(f"transformers {transformers.__version__}")
print(f"safetensors  {safetensors.__version__}")
print(f"numpy        {numpy.__version__}")
print(f"accelerate   {accelerate.__version__}")
print(f"einops       {einops.__version__}")
PYEOF
