#!/usr/bin/env bash
# Download, on this machine, the wheels aa-ray needs to train on a GPU box that has Python, torch,
# numpy and pyarrow but no network: with `runtime.backend: inline` and `tracking.enabled: false`
# nothing imports Ray or MLflow, so the set is gymnasium, MuJoCo, pydantic, PyYAML and rich, each
# with its own dependencies. The folder travels with the working tree (64 MiB in all, repository
# included), and `benchmarks/gpu_check.py --install-wheels DIR` installs it there, offline.
#
#   scripts/fetch_gpu_wheels.sh            # cp312 manylinux x86_64 wheels into gpu_wheels/ (the GPU box)
#   scripts/fetch_gpu_wheels.sh --local    # the same packages for .venv's Python, into gpu_wheels_local/
#                                          # (to dry-run the offline install here)
#   scripts/fetch_gpu_wheels.sh --python-version 3.12 --dest DIR
#
# Versions are pinned to what .venv has (`pip freeze`): the GPU run uses the code's tested versions.
# numpy, torch and pyarrow are never fetched (the box has its own builds; torch's CUDA wheel alone
# would not fit).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=3.12
DEST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --local) PYTHON_VERSION=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
             DEST=${DEST:-gpu_wheels_local} ;;
    --python-version) PYTHON_VERSION=$2; shift ;;
    --dest) DEST=$2; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "fetch_gpu_wheels: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
DEST=${DEST:-gpu_wheels}
LIMIT_MIB=40  # the repository and the wheels share 64 MiB on the way to the GPU box

# What the inline training path imports, found by running `gpu_check.py --dry-run` in a venv that
# had only torch, numpy and pyarrow, then each package's own requirements (`pip show`). Left out on
# purpose (installed with --no-deps): mujoco-studio (12 MiB, MuJoCo 4's viewer and Filament renderer,
# which `import mujoco` does not load) with its websockets, and pillow (7 MiB, only the eval video).
PACKAGES=(
  gymnasium cloudpickle farama-notifications typing-extensions  # the env API
  mujoco mujoco-core glfw pyopengl                              # MuJoCo 4's bindings; GL for offscreen use
  imageio packaging                                             # gymnasium.envs.mujoco imports its renderer
  pydantic pydantic-core annotated-types typing-inspection      # the spec models
  pyyaml                                                        # spec files
  rich markdown-it-py mdurl pygments                            # the progress display
)

# name==version for each package, from .venv (names compared the way pip normalizes them)
FREEZE=$(.venv/bin/python -m pip freeze 2>/dev/null)
PINS=()
for name in "${PACKAGES[@]}"; do
  pin=$(printf '%s\n' "$FREEZE" | awk -F'==' -v want="$name" '
    { key = tolower($1); gsub(/[-_.]+/, "-", key); if (key == want) { print $1 "==" $2; exit } }')
  if [ -z "$pin" ]; then
    echo "fetch_gpu_wheels: $name is not installed in .venv; run scripts/setup.sh first" >&2
    exit 1
  fi
  PINS+=("$pin")
done

mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # only the wheels: DEST may be any folder the caller names
echo "fetching ${#PINS[@]} wheels for cp${PYTHON_VERSION/./} manylinux x86_64 into $DEST/"
# --no-deps: the list above is the whole closure minus what the box has; several --platform tags
# because MuJoCo and glfw are built for glibc 2.27/2.28 and the rest for manylinux2014 (torch's own
# wheels need glibc 2.28, so any box with torch can load them)
.venv/bin/python -m pip download --quiet --dest "$DEST" --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "${PINS[@]}"

ls -l "$DEST"/*.whl | awk '{printf "  %8.1f KiB  %s\n", $5 / 1024, $NF}'
total=$(cat "$DEST"/*.whl | wc -c)
awk -v bytes="$total" -v dest="$DEST" 'BEGIN { printf "total: %.1f MiB in %s/\n", bytes / 1048576, dest }'
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "fetch_gpu_wheels: over ${LIMIT_MIB} MiB: the repository and these wheels would not fit in 64 MiB" >&2
  exit 1
fi
