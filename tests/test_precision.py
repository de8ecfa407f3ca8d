"""`algo.precision: auto`: bf16 where the learner's device has it natively, fp32 where it would be
emulated, and one warning per process for an explicit bf16 where it is emulated. The decision is
tested on real cpuinfo texts and restrictions; the emulated CPU is this machine's own, restricted the
way torch and oneDNN are restricted in practice (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), in a
fresh process since both are read when torch starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from aa_ray.algos.gradient_step import GradientStep
from aa_ray.algos.precision import (
    bf16_native,
    cpu_bf16_native,
    cpuinfo_flags,
    resolve_precision,
    x86_bf16_missing,
    x86_bf16_native,
)
from aa_ray.errors import SpecError
from aa_ray.runtime.learner import Learner
from aa_ray.runtime.replay import ReplayBuffer
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
SMALL = ["tracking.enabled=false", "algo.actor_hidden_dims=[32,32]", "algo.critic_hidden_dims=[32,32]",
         "algo.batch_size=32", "algo.warm_up_steps=10", "learners.compile=off"]
CPU = torch.device("cpu")
THIS_CPU = cpuinfo_flags(Path("/proc/cpuinfo").read_text()) if Path("/proc/cpuinfo").exists() else None  # x86 flags

# the first lines of /proc/cpuinfo on three machines (flags shortened to what matters plus neighbours)
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq rdpid
"""
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni gfni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx avx2 avx512f avx512bw avx512vl avx512_vnni amx_bf16 amx_tile amx_int8
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm svebf16
"""


def test_flags_say_which_x86_cpus_have_bf16() -> None:
    assert x86_bf16_native(cpuinfo_flags(ZEN4), None)
    assert x86_bf16_native(cpuinfo_flags(SAPPHIRE_RAPIDS), None)
    assert not x86_bf16_native(cpuinfo_flags(ZEN3), None)
    assert x86_bf16_missing(cpuinfo_flags(ZEN3), None) == ["no avx512_bf16 or amx_bf16 in /proc/cpuinfo"]
    assert x86_bf16_missing(cpuinfo_flags(ZEN3), "avx2") == [
        "no avx512_bf16 or amx_bf16 in /proc/cpuinfo", "ONEDNN_MAX_CPU_ISA=AVX2"]
    assert cpuinfo_flags(GRAVITON3) is None  # not x86: the timed probe decides there
    assert cpuinfo_flags("") is None


@pytest.mark.parametrize(("onednn", "native"), [
    (None, True),
    ("", True),
    ("AVX2", False),  # oneDNN capped below bf16 dot products: its bf16 matmuls emulate
    ("avx512_core", False),  # AVX-512 without BF16 (Skylake's): still emulated
    ("AVX512_CORE_BF16", True),
    ("avx512_core_amx", True),
    ("DEFAULT", True),
    ("no_such_isa", True),  # oneDNN ignores a value it does not know
])
def test_a_cap_on_onednn_takes_bf16_away(onednn: str | None, native: bool) -> None:
    """ATEN_CPU_CAPABILITY is no input: capped at avx2, a Zen 4 still ran the fast spec's compiled
    update 1.2x faster in bf16 than in fp32 (benchmarks/RESULTS.md section 21)."""
    assert x86_bf16_native(cpuinfo_flags(ZEN4), onednn) is native


def test_auto_resolves_to_what_this_machine_has() -> None:
    if THIS_CPU is not None:
        expected = x86_bf16_native(THIS_CPU, os.environ.get("ONEDNN_MAX_CPU_ISA"))
        assert cpu_bf16_native() is expected
    assert resolve_precision("auto", CPU) == ("bf16" if bf16_native(CPU) else "fp32")
    assert resolve_precision("fp32", CPU) == "fp32" and resolve_precision("fp16", CPU) == "fp16"
    assert resolve_precision("auto", torch.device("meta")) == "fp32"  # a device it cannot judge: the safe choice
    layer = torch.nn.Linear(2, 1)
    step = GradientStep(torch.optim.Adam(layer.parameters()), max_grad_norm=None, precision="auto", device=CPU)
    assert step.scaler is None  # auto never resolves to fp16, so it never loss-scales


def test_spec_accepts_auto_and_the_fast_spec_uses_it() -> None:
    assert load_spec(SPECS / "mujoco" / "fast_cpu.yaml").algo.precision == "auto"
    assert load_spec(SPECS / "sac.yaml").algo.precision == "fp32"  # the knob's default is unchanged
    assert load_spec(SPECS / "sac.yaml", ["algo.precision=auto"]).algo.precision == "auto"
    with pytest.raises(SpecError, match="precision"):
        load_spec(SPECS / "sac.yaml", ["algo.precision=bf32"])


def test_a_short_update_with_auto_trains_and_reports_what_it_resolved_to() -> None:
    spec = load_spec(SPECS / "mujoco" / "fast_cpu.yaml", SMALL)
    learner = Learner(spec, 10, 2)
    replay = ReplayBuffer(1000, 10, 2, seed=0)
    rng = np.random.default_rng(0)
    replay.add(_transitions(rng, 200))
    metrics = learner.update([], replay.sample(6, 32)).metrics
    assert np.isfinite(metrics["critic/q_loss"]) and np.isfinite(metrics["actor/loss"])
    assert metrics["learner/bf16"] == float(bf16_native(CPU))


def _transitions(rng: np.random.Generator, n: int):
    from aa_ray.records import Transitions

    obs = rng.standard_normal((n, 10), dtype=np.float32)
    return Transitions(
        obs=obs, action=rng.uniform(-1, 1, (n, 2)).astype(np.float32), reward=rng.standard_normal(n, dtype=np.float32),
        next_obs=obs + 0.1, terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), discount=np.ones(n, np.float32),
    )


EMULATED = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    sys.path.insert(0, {tests!r})
    from test_precision import SMALL, SPECS, _transitions
    from aa_ray.algos.precision import bf16_matmul_speedup, resolve_precision
    from aa_ray.runtime.learner import Learner
    from aa_ray.runtime.replay import ReplayBuffer
    from aa_ray.spec.loader import load_spec

    replay = ReplayBuffer(1000, 10, 2, seed=0)
    replay.add(_transitions(np.random.default_rng(0), 200))
    out = {{"resolved": resolve_precision("auto", torch.device("cpu")), "speedup": bf16_matmul_speedup()}}
    for precision in ("auto", "bf16", "bf16"):  # two bf16 learners: one warning all the same
        spec = load_spec(SPECS / "mujoco" / "fast_cpu.yaml", [*SMALL, f"algo.precision={{precision}}"])
        learner = Learner(spec, 10, 2)
        metrics = learner.update([], replay.sample(3, 32)).metrics
        out[precision] = [metrics["learner/bf16"], bool(np.isfinite(metrics["critic/q_loss"]))]
    print(json.dumps(out))
""")


@pytest.mark.skipif(THIS_CPU is None, reason="not x86 Linux: the test emulates a CPU without bf16 by oneDNN's ISA cap")
def test_where_bf16_is_emulated_auto_is_fp32_and_an_explicit_bf16_warns_once() -> None:
    """This CPU restricted to AVX2 (what a Zen 3 has): bf16 matmuls are measured slower than fp32 in
    the same process, auto resolves to fp32, and two learners built with bf16 log one warning."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", EMULATED.format(tests=str(ROOT / "tests"))], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["speedup"] < 1.0, "the restriction did not make bf16 slower: the test would prove nothing"
    assert out["resolved"] == "fp32" and out["auto"] == [0.0, True]
    warnings = [line for line in done.stderr.splitlines() if "algo.precision: bf16 on this cpu" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in warnings[0] and "auto" in warnings[0] and "fp32" in warnings[0]
    assert out["bf16"] == [1.0, True]  # the explicit bf16 still runs bf16, as asked


def test_an_explicit_bf16_where_it_is_native_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    if not bf16_native(CPU):
        pytest.skip("this CPU emulates bf16 (the subprocess test covers that side)")
    with caplog.at_level("WARNING"):
        resolve_precision("bf16", CPU)
    assert not [r for r in caplog.records if "algo.precision" in r.getMessage()]
