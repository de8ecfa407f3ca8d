# The README's two commands: `make run` and `make test`. Both set everything up first.
.PHONY: setup run test lint bench

setup:
	./scripts/setup.sh

run: setup
	.venv/bin/aa-ray run specs/sac_simba.yaml

# test also installs the optional env sources the tests cover (the envpool extra comes with dev); the
# playground extra is resolved on its own, in about a minute: together with the rest pip backtracks for minutes
test: setup
	.venv/bin/python -m pip install --quiet -e ".[playground]"
	.venv/bin/ruff check .
	.venv/bin/pytest

bench: setup
	.venv/bin/python -m pip install --quiet -e ".[bench]"
	.venv/bin/python benchmarks/run_all.py
