"""CPU seconds per test of a whole pytest run, with every process a test starts counted: its
commands, its Ray's daemons and workers, its servers, its benchmarks. `--durations` gives wall time
only, and on a saturated 2-core machine a test's wall time says little about what it costs the other
worker.

  .venv/bin/python scripts/cpu_by_test.py install        # a .pth hook in .venv, idle unless the variable is set
  AA_RAY_CPU_TRACE=/tmp/cpu make test                   # or any pytest command
  .venv/bin/python scripts/cpu_by_test.py report /tmp/cpu
  .venv/bin/python scripts/cpu_by_test.py uninstall

While the variable names a folder, every Python process of the venv writes its CPU time (user and
system, `os.times`) there once a second and at exit, with its command line and the
PYTEST_CURRENT_TEST it inherited: a test's commands inherit it from the pytest worker, and the Ray
workers and daemons from the raylet its Ray started with. What this misses: processes that are not
Python (Ray's GCS and raylet, Chromium), up to a second before a SIGKILL, and the pytest workers'
own split between tests (they are counted whole, under no test).
"""

from __future__ import annotations

import argparse
import collections
import json
import site
import sys
from pathlib import Path

MODULE = "_aa_ray_cpu_trace"
VARIABLE = "AA_RAY_CPU_TRACE"
HOOK = f'''"""Written by scripts/cpu_by_test.py: this process's CPU time, once a second, into ${VARIABLE}."""
import os

if os.environ.get("{VARIABLE}"):
    import atexit, json, sys, threading, time

    _folder = os.environ["{VARIABLE}"]
    _record = {{"argv": sys.argv[:4], "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "cpu": 0.0}}
    _path = os.path.join(_folder, f"{{os.getpid()}}-{{time.time_ns()}}.json")

    def _write():
        times = os.times()
        _record["cpu"] = times.user + times.system
        _record["argv"] = sys.argv[:4]  # at start-up `python -m x` is still ["-m"]: runpy sets it later
        _record["xdist"] = os.environ.get("PYTEST_XDIST_WORKER", "")  # set in a worker once it has started
        try:
            with open(_path + ".tmp", "w") as out:
                json.dump(_record, out)
            os.replace(_path + ".tmp", _path)  # whole or not at all, even for a process that ends mid-write
        except OSError:
            pass

    def _every_second():
        while True:
            _write()
            time.sleep(1.0)

    os.makedirs(_folder, exist_ok=True)
    threading.Thread(target=_every_second, daemon=True, name="cpu-trace").start()
    atexit.register(_write)
'''


def kind_of(record: dict) -> str:
    argv = record["argv"]
    text = " ".join(argv)
    if (record.get("xdist") and not record["test"]) or (argv and Path(argv[0]).name in ("pytest", "py.test")):
        return "pytest"  # an xdist worker started before any test; its commands inherit the test's name
    if "default_worker" in text or "setup_worker" in text:
        return "Ray worker"
    if any(daemon in text for daemon in ("dashboard", "log_monitor", "monitor.py", "runtime_env", "agent")):
        return "Ray daemon"
    if "aa_ray.cli" in text or "aa_ray/cli.py" in text or (argv and Path(argv[0]).name == "aa-ray"):  # -m: the path
        return "aa-ray command"
    if "benchmarks/" in text:
        return "benchmark"
    if "mlflow" in text:
        return "MLflow"
    return "other"


def report(folder: Path, top: int) -> None:
    by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    processes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in folder.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        test_file = record["test"].split("::")[0] or "(no test: the pytest workers themselves, setup)"
        kind = kind_of(record)
        by_file[test_file][kind] += record["cpu"]
        processes[test_file][kind] += 1
    totals = collections.Counter()
    for kinds in by_file.values():
        totals.update(kinds)
    print(f"{sum(totals.values()):,.0f} CPU-s in all")
    for kind, seconds in totals.most_common():
        print(f"  {kind:<16s} {seconds:8,.0f} CPU-s  {sum(p[kind] for p in processes.values()):5d} processes")
    print(f"\nby test file (CPU-s, then CPU-s/processes by kind), the {top} largest:")
    for test_file, kinds in sorted(by_file.items(), key=lambda item: -sum(item[1].values()))[:top]:
        parts = ", ".join(f"{kind} {seconds:.0f}/{processes[test_file][kind]}" for kind, seconds in kinds.most_common())
        print(f"{sum(kinds.values()):8.0f}  {test_file}: {parts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install", "uninstall", "report"])
    parser.add_argument("folder", nargs="?", type=Path, help="report: the folder AA_RAY_CPU_TRACE named")
    parser.add_argument("--top", type=int, default=40, help="report: how many test files to list")
    args = parser.parse_args()
    site_packages = Path(site.getsitepackages()[0])
    if sys.prefix == sys.base_prefix:
        parser.error("run it with the venv's Python (.venv/bin/python), whose site-packages get the hook")
    if args.action == "install":
        (site_packages / f"{MODULE}.py").write_text(HOOK)
        (site_packages / f"{MODULE}.pth").write_text(f"import {MODULE}\n")
        print(f"installed in {site_packages}; set {VARIABLE}=<folder> to record")
    elif args.action == "uninstall":
        for name in (f"{MODULE}.py", f"{MODULE}.pth"):
            (site_packages / name).unlink(missing_ok=True)
        print(f"removed from {site_packages}")
    else:
        if args.folder is None or not args.folder.is_dir():
            parser.error(f"report needs the folder {VARIABLE} named, with the records in it")
        report(args.folder, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
