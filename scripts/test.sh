#!/usr/bin/env bash
# The whole test suite as two pytest processes at once: the learning tests (training runs that must
# reach a threshold; each keeps about one core busy) and everything else (much of which waits on Ray,
# Tune, MLflow and subprocesses), so both cores of a small machine work throughout. Lines are
# prefixed with their half; each half ends with its own summary and slowest tests. Fails if either
# half fails. Extra arguments go to both, e.g. scripts/test.sh -x. One half alone: pytest -m learning.
set -uo pipefail
cd "$(dirname "$0")/.."
extra=$#
base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
.venv/bin/pytest -m learning --basetemp "$base/learning" -p no:cacheprovider "$@" \
  > >(sed -u 's/^/[learning] /') 2>&1 &
learning=$!
.venv/bin/pytest -m "not learning" --basetemp "$base/rest" "$@" > >(sed -u 's/^/[rest] /') 2>&1 &
rest=$!
wait "$learning"
learning_status=$?
wait "$rest"
rest_status=$?
wait  # the prefixing filters
echo "learning tests: exit $learning_status; the rest: exit $rest_status"
passed() {  # pytest's 5 is "no tests collected": fine when arguments chose tests of one half only
  [ "$1" -eq 0 ] || { [ "$1" -eq 5 ] && [ "$extra" -gt 0 ]; }
}
passed "$learning_status" && passed "$rest_status"
