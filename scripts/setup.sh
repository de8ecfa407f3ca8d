#!/usr/bin/env bash
# Create .venv and install aa-ray with its test tools. Safe to run again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

# torch first, so the package install below does not pull a multi-GB CUDA build on a CPU-only
# machine. TORCH_REQUIREMENT overrides the choice.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_REQUIREMENT:-}" ]; then
    torch_req=$TORCH_REQUIREMENT
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_req="torch>=2.4"
  else
    torch_req="torch==2.13.0"  # the CPU build this project is developed and tested with
  fi
  echo "installing $torch_req"
  .venv/bin/python -m pip install --quiet "$torch_req"
fi

.venv/bin/python -m pip install --quiet -e ".[dev]"
# the package's bytecode, once: where PYTHONDONTWRITEBYTECODE is set, every process that imports it
# (each Ray worker, each CLI call) would compile it again, about 0.2 s of CPU each
.venv/bin/python -m compileall -q aa_ray
echo "aa-ray is installed in .venv (activate with: source .venv/bin/activate)"
