"""Which machine a run ran on, as MLflow tags, so a report made elsewhere can say on which CPU its
wall-clock times were measured and which runs shared that machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPU_TAG = "aa_ray.cpu"  # the CPU's model name
CPU_COUNT_TAG = "aa_ray.cpu_count"  # logical CPUs this process may use
HOST_TAG = "aa_ray.host"  # runs that overlap in time on one host shared its CPUs


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    # the affinity mask, not the machine's count: a container or taskset may allow fewer
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_tags() -> dict[str, str]:
    return {CPU_TAG: cpu_model(), CPU_COUNT_TAG: str(usable_cpus()), HOST_TAG: platform.node()}
