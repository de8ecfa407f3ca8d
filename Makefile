# The README's two commands: `make run` and `make test`. Both set everything up first.
.PHONY: setup run test lint bench

setup:
	./scripts/setup.sh

run: setup
	.venv/bin/aa-ray run specs/sac_simba.yaml

# test also installs the optional env sources the tests cover (the envpool extra comes with dev)
test:
	./scripts/setup.sh dev playground
	.venv/bin/ruff check .
	.venv/bin/pytest

bench:
	./scripts/setup.sh dev bench
	.venv/bin/python benchmarks/run_all.py
