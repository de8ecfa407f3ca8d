"""`algo.precision`: which dtype an update's autocast runs in, on the learner's own device.

`auto` is bf16 where the device computes bf16 natively and fp32 elsewhere. An explicit `bf16` where
the device only emulates it still runs (it is what the spec asked for) but says once per process how
much slower it will be: a 2-core Zen 3 VM (AVX2, no AVX-512) trained specs/mujoco/fast_cpu.yaml 11.6x
slower in bf16 than in fp32 (issue 34), and a Zen 4 restricted to AVX2 ran its update 5x slower
(benchmarks/RESULTS.md, section 21).

How a CPU is judged. On x86 Linux the answer comes from what the hardware has and what oneDNN is
allowed to use, read once per process:
- /proc/cpuinfo's flags: `avx512_bf16` (Cooper Lake, Zen 4 and later) or `amx_bf16` (Sapphire Rapids
  and later). Without either, oneDNN's bf16 matmul converts through fp32 in software;
- `ONEDNN_MAX_CPU_ISA`: oneDNN (torch's CPU matmuls in bf16) never uses an ISA above it, so a cap
  below AVX512_CORE_BF16 emulates bf16 on any hardware (measured on a Zen 4 capped at AVX2: bf16
  matmuls at width 256 30x slower than fp32, the fast spec's compiled update 5x slower).
`ATEN_CPU_CAPABILITY` (torch's own vector kernels and Inductor's generated code) is deliberately not
part of the verdict: capped at avx2 on the same Zen 4, bf16 matmuls still ran 2x faster than fp32
and the compiled bf16 update 1.2x faster than fp32 (the matmuls are oneDNN's, which it does not cap).
These rules are deterministic: the same machine and environment always resolve alike, so a run's
numerics never hang on timing noise (the machines this spec is for are small and often shared),
and they cost nothing at start-up. Where /proc/cpuinfo has no x86 flags (another architecture or
OS), the flags say nothing, and a short timed probe decides instead: bf16 when a matmul at the
fast spec's width runs faster in bf16 than in fp32 (emulated bf16 is an order of magnitude slower,
native bf16 about 2x faster, so the verdict has a wide margin either way).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16", "auto")
X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# ONEDNN_MAX_CPU_ISA values below which oneDNN has no bf16 dot-product instructions (oneDNN's names;
# AVX2_VNNI_2 has bf16 conversions but no bf16 dot product, so it counts as emulated here)
ONEDNN_ISAS_WITHOUT_BF16 = frozenset({
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
})
EMULATED_SLOWDOWN = ("specs/mujoco/fast_cpu.yaml trained 11.6x slower on a 2-core Zen 3 VM; its update ran 5x slower "
                     "on a Zen 4 capped at AVX2, benchmarks/RESULTS.md section 21")


def cpuinfo_flags(cpuinfo: str) -> frozenset[str] | None:
    """The x86 feature flags of the first processor listed in a /proc/cpuinfo text; None where the
    text has no `flags` line (not x86 Linux)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def x86_bf16_native(flags: frozenset[str], onednn_max_isa: str | None) -> bool:
    """Whether an x86 CPU with these flags runs bf16 natively when oneDNN is capped at
    `onednn_max_isa` (the ONEDNN_MAX_CPU_ISA setting; None when unset)."""
    return not x86_bf16_missing(flags, onednn_max_isa)


def x86_bf16_missing(flags: frozenset[str], onednn_max_isa: str | None) -> list[str]:
    """What keeps an x86 CPU from native bf16, in words for the warning (empty: nothing)."""
    missing = []
    if not flags & X86_BF16_FLAGS:
        missing.append("no avx512_bf16 or amx_bf16 in /proc/cpuinfo")
    # oneDNN reads the value case-insensitively and ignores one it does not know, which then caps nothing
    isa = (onednn_max_isa or "").strip().upper()
    if isa in ONEDNN_ISAS_WITHOUT_BF16:
        missing.append(f"ONEDNN_MAX_CPU_ISA={isa}")
    return missing


def _read_cpuinfo() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text()
    return ""


def bf16_matmul_speedup(width: int = 256, rows: int = 512, repeats: int = 5) -> float:
    """fp32 seconds over bf16 seconds for one (rows, width) x (width, width) matmul on the CPU, the
    best of `repeats` each, alternating (above 1: bf16 is faster)."""
    x, w = torch.randn(rows, width), torch.randn(width, width)
    xb, wb = x.bfloat16(), w.bfloat16()
    best = {"fp32": float("inf"), "bf16": float("inf")}
    with torch.no_grad():
        xb @ wb, x @ w  # first calls pick kernels and allocate: not timed
        for _ in range(repeats):
            for name, (a, b) in (("fp32", (x, w)), ("bf16", (xb, wb))):
                start = time.perf_counter()
                a @ b
                best[name] = min(best[name], time.perf_counter() - start)
    return best["fp32"] / max(best["bf16"], 1e-12)


@functools.cache
def cpu_bf16_native() -> bool:
    """This process's verdict for its CPU (module docstring): the flags and restrictions on x86 Linux,
    the timed probe elsewhere. Decided once and cached: the hardware and the restrictions (read by
    torch and oneDNN at start-up) do not change within a process."""
    flags = cpuinfo_flags(_read_cpuinfo())
    if flags is None:
        native = bf16_matmul_speedup() > 1.0
        log.info("algo.precision: bf16 matmuls %s than fp32 on this CPU (probe)", "faster" if native else "slower")
        return native
    return x86_bf16_native(flags, os.environ.get("ONEDNN_MAX_CPU_ISA"))


@functools.cache
def cuda_bf16_native(device: torch.device) -> bool:
    """Ampere (compute capability 8.0) and later have bf16 tensor cores; torch emulates bf16 on older
    GPUs, which `is_bf16_supported` counts as support unless told not to."""
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    return native and torch.cuda.get_device_capability(device) >= (8, 0)


def bf16_native(device: torch.device) -> bool:
    """Whether `device` computes bf16 natively. Devices other than the CPU and CUDA: not judged, False."""
    if device.type == "cpu":
        return cpu_bf16_native()
    if device.type == "cuda":
        return cuda_bf16_native(device)
    return False


_warned: set[str] = set()  # device types warned about: one line per process each


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision an update on `device` runs in: `auto` becomes bf16 where the device has it
    natively, else fp32; the others stay as they are. An explicit bf16 on a CPU or GPU that emulates
    it warns once per process."""
    if precision == "auto":
        return "bf16" if bf16_native(device) else "fp32"
    if precision == "bf16" and device.type in ("cpu", "cuda") and device.type not in _warned \
            and not bf16_native(device):
        _warned.add(device.type)
        log.warning(
            "algo.precision: bf16 on this %s, which has no native bf16 (%s): torch emulates it, expect "
            "updates several times slower than fp32 (%s). Set algo.precision: auto (bf16 only where it "
            "is native) or fp32", device.type, _why_emulated(device), EMULATED_SLOWDOWN,
        )
    return precision


def _why_emulated(device: torch.device) -> str:
    if device.type == "cuda":
        return f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))}, below 8.0"
    flags = cpuinfo_flags(_read_cpuinfo())
    if flags is None:
        return "bf16 matmuls measured slower than fp32"
    return ", ".join(x86_bf16_missing(flags, os.environ.get("ONEDNN_MAX_CPU_ISA")))


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype the update's matmuls run in (fp32 when autocast is off)."""
    resolved = resolve_precision(precision, device)
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolved, torch.float32)
