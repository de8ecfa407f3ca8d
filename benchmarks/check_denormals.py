"""Subnormal floats in the learner's Adam moments during real training, and what they cost.

Trains SAC in this process (EnvRunner + ReplayBuffer + Learner, the Trainer's loop without Ray)
and, every 1000 learning steps, counts the subnormal entries (0 < |x| < 1.2e-38) in the actor and
critic optimizer states and profiles one learner call (16 updates) for the time spent in
`aten::_fused_adam_`. A ReLU unit that stops receiving gradient has its Adam first moment
multiplied by 0.9 every step, so within ~800 steps it decays into the subnormal range, where x86
arithmetic is many times slower unless flush-to-zero is on (`torch.set_flush_denormal(True)`).

Run:  .venv/bin/python benchmarks/check_denormals.py [--env pendulum|pusher] [--budget 3000] [--flush-denormal]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SPECS, add_smoke, machine_info, print_machine, print_table  # noqa: E402
from _timed import trainer_overrides  # noqa: E402

from aa_ray.envs import env_dims  # noqa: E402
from aa_ray.records import Batch  # noqa: E402
from aa_ray.runtime.env_runner import EnvRunner  # noqa: E402
from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

TINY = torch.finfo(torch.float32).tiny


def optimizer_states(algo) -> list[torch.Tensor]:
    """The moment tensors of every optimizer the algorithm holds, a few attributes deep (found by
    type: the attribute names differ between algorithms and change)."""
    optimizers, seen, frontier = [], set(), [algo]
    for _ in range(4):
        inner = []
        for part in frontier:
            if id(part) in seen or isinstance(part, (torch.Tensor, torch.nn.Module)):
                continue
            seen.add(id(part))
            if isinstance(part, torch.optim.Optimizer):
                optimizers.append(part)
            elif hasattr(part, "__dict__"):
                inner += vars(part).values()
        frontier = inner
    if not optimizers:
        raise RuntimeError(f"found no optimizer on {type(algo).__name__}: nothing to count")
    states = []
    for optimizer in optimizers:
        for state in optimizer.state.values():
            states += [v for v in state.values() if torch.is_tensor(v) and v.numel() > 1]
    return states


def count_subnormal(tensors: list[torch.Tensor]) -> int:
    return sum(int(((t != 0) & (t.abs() < TINY)).sum()) for t in tensors)


def profile_call(learner: Learner, replay: ReplayBuffer, num: int, batch_size: int) -> tuple[float, float]:
    """(fused-Adam µs per update, all ops µs per update) over one learner call of `num` updates."""
    stack = Batch.from_transitions(replay.sample(num, batch_size), learner.device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(num):
            learner.algo.update(Batch(*(t[i : i + 1] for t in stack)))
    events = {e.key: e.self_cpu_time_total / num for e in prof.key_averages()}
    return events.get("aten::_fused_adam_", 0.0), sum(events.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=("pendulum", "pusher"), default="pendulum")
    parser.add_argument("--budget", type=int, default=3000)
    parser.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True) first")
    add_smoke(parser)
    args = parser.parse_args()
    warm_up = 1000
    if args.smoke:  # one report, at the end of a short warm-up, then three learner calls
        args.budget, warm_up = 256, 200
    torch.set_num_threads(1)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        sys.exit("this CPU does not support flushing denormals")
    print_machine(machine_info())
    spec_file = SPECS / ("sac_pendulum.yaml" if args.env == "pendulum" else "sac.yaml")
    spec = load_spec(spec_file, trainer_overrides(args.budget, warm_up, None, Path(tempfile.mkdtemp())))
    algo = spec.algo
    obs, act_dim = env_dims(spec)
    obs_dim = obs.full
    runner, learner = EnvRunner(spec, 0), Learner(spec, obs_dim, act_dim)
    replay = ReplayBuffer(algo.buffer_size, obs_dim, act_dim, seed=spec.seed)
    runner.set_weights(*learner.policy_state())
    print(f"# {spec_file.name}: {spec.env.id}, budget {args.budget}, flush_denormal={args.flush_denormal}")

    steps, learning, pending, next_report, rows = 0, False, [], algo.warm_up_steps, []
    while steps < args.budget:
        transitions, stats = runner.sample(algo.train_every, steps < algo.warm_up_steps)
        if learning:
            learner.update(pending, replay.sample(algo.train_every * algo.utd_ratio, algo.batch_size))
            pending = []
            runner.set_weights(*learner.policy_state())
        replay.add(transitions)
        steps += stats.env_steps
        pending.append(stats.moments)
        learning = learning or steps >= algo.warm_up_steps
        if steps >= next_report:
            next_report += 1000
            adam_us, total_us = profile_call(learner, replay, algo.train_every, algo.batch_size)
            states = optimizer_states(learner.algo)
            rows.append([steps, count_subnormal(states), sum(t.numel() for t in states), adam_us, total_us / 1000])
            print(f"  {steps} env steps done", flush=True)
    print_table(["env steps", "subnormal Adam moments", "of", "fused Adam µs/update", "profiled update ms"], rows)


if __name__ == "__main__":
    main()
