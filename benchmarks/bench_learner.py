"""Learner update rate: aa-ray's `Learner.update` vs a bare-torch SAC update (plain single-file style).

Both sides do, per update: uniform sampling of one batch of 256 transitions from a numpy replay,
conversion to torch, one critic step (both critics), one actor step, one temperature step and a
polyak update of the target critics. Networks: 256x256 ReLU MLPs, twin critics, squashed-Gaussian
actor, one Adam per part; torch.set_num_threads(1) in this process for both.

- ours: `ReplayBuffer.sample_for_learners(train_every, 256, 1)` (one stacked draw of packed rows per
  learner call, as the replay actor does) + `Learner.update([], sample)` (the rows split into a
  `Batch`, the SAC update loop and the once-per-call diagnostics). No Ray: both run in this process.
- reference: written here, the shape of a single-file SAC script: two separate critic
  nn.Sequential MLPs and two target copies, an actor with separate mean/log-std heads, a numpy
  ring buffer sampled with `rng.integers` once per update, `torch.from_numpy` on the gathered rows,
  a per-parameter polyak loop. The critics keep requires_grad during the actor step (the plain way).

Also measured, to separate compute from data handling: both sides on one pre-made batch reused
("update only"): ours calls `Learner.algo.update` directly, one fleet step's slice at a time
(what `Learner.update` does after `Batch.from_transitions`). And the reference with
`torch.optim.Adam(fused=True)` (update only): torch's default Adam on the CPU is the per-parameter
for-loop implementation, while aa-ray's SAC asks for the fused one.

Run:  .venv/bin/python benchmarks/bench_learner.py [--reps 8] [--updates 80] [--profile] [--flush-denormal]
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SPECS,
    alternate,
    base_parser,
    command_line,
    machine_info,
    median_ratio,
    print_machine,
    print_table,
    write_json,
)

from aa_ray.records import Batch, Transitions  # noqa: E402
from aa_ray.runtime.learner import Learner  # noqa: E402
from aa_ray.runtime.replay import ReplayBuffer  # noqa: E402
from aa_ray.spec.loader import load_spec  # noqa: E402

DIMS = {"pendulum (3/1)": (3, 1), "pusher-reach (10/2)": (10, 2)}
BATCH = 256
BUFFER = 100_000
HIDDEN = 256
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


# ---- the reference: a plain single-file SAC update ------------------------------------------
def mlp(in_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, out_dim)
    )


class RefActor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU())
        self.mean = nn.Linear(HIDDEN, act_dim)
        self.log_std = nn.Linear(HIDDEN, act_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(obs)
        mean = self.mean(h)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(self.log_std(h)) + 1.0)
        noise = torch.randn_like(mean)
        pre = mean + log_std.exp() * noise
        action = torch.tanh(pre)
        log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = log_prob - torch.log(1.0 - action.pow(2) + 1e-6)
        return action, log_prob.sum(-1)


class ReferenceSAC:
    """Buffer + networks + update, as one would write them in a single script."""

    def __init__(self, obs_dim: int, act_dim: int, data: dict[str, np.ndarray], seed: int = 0, fused: bool = False):
        torch.manual_seed(seed)
        self.gamma, self.tau = 0.99, 0.005
        self.actor = RefActor(obs_dim, act_dim)
        self.q1, self.q2 = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
        self.q1_target, self.q2_target = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
        self.q1_target.load_state_dict(self.q1.state_dict())
        self.q2_target.load_state_dict(self.q2.state_dict())
        self.q_params = [*self.q1.parameters(), *self.q2.parameters()]
        self.target_params = [*self.q1_target.parameters(), *self.q2_target.parameters()]
        # fused=None is torch's default, which on the CPU is the per-parameter (for-loop) Adam
        fused = fused or None
        self.q_opt = torch.optim.Adam(self.q_params, lr=1e-3, fused=fused)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=3e-4, fused=fused)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=1e-3, fused=fused)
        self.alpha = self.log_alpha.exp().item()
        self.target_entropy = -float(act_dim)
        # replay: plain numpy arrays, filled already
        self.obs, self.act, self.rew = data.obs, data.action, data.reward
        self.next_obs, self.done = data.next_obs, data.terminated
        self.size = len(self.rew)
        self.rng = np.random.default_rng(seed)

    def sample(self) -> tuple[torch.Tensor, ...]:
        idx = self.rng.integers(0, self.size, BATCH)
        return (
            torch.from_numpy(self.obs[idx]), torch.from_numpy(self.act[idx]), torch.from_numpy(self.rew[idx]),
            torch.from_numpy(self.next_obs[idx]), torch.from_numpy(self.done[idx]),
        )

    def update(self, obs, act, rew, next_obs, done) -> None:
        with torch.no_grad():
            next_act, next_log_prob = self.actor(next_obs)
            x = torch.cat([next_obs, next_act], -1)
            next_q = torch.min(self.q1_target(x), self.q2_target(x)).squeeze(-1) - self.alpha * next_log_prob
            target = rew + self.gamma * (1.0 - done) * next_q
        x = torch.cat([obs, act], -1)
        q_loss = nn.functional.mse_loss(self.q1(x).squeeze(-1), target) + nn.functional.mse_loss(
            self.q2(x).squeeze(-1), target
        )
        self.q_opt.zero_grad()
        q_loss.backward()
        self.q_opt.step()

        pi_act, log_prob = self.actor(obs)
        x = torch.cat([obs, pi_act], -1)
        q_pi = torch.min(self.q1(x), self.q2(x)).squeeze(-1)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()
        self.alpha = self.log_alpha.exp().item()

        with torch.no_grad():
            for p, tp in zip(self.q_params, self.target_params, strict=True):
                tp.lerp_(p, self.tau)


# ---- ours -----------------------------------------------------------------------------------
def random_replay(obs_dim: int, act_dim: int, seed: int = 0) -> ReplayBuffer:
    """A full replay of random transitions (every field the buffer stores, whatever they are)."""
    rng = np.random.default_rng(seed)
    replay = ReplayBuffer(BUFFER, obs_dim, act_dim, seed=seed)
    special = {
        "action": lambda shape: rng.uniform(-1, 1, shape),
        "terminated": lambda shape: rng.random(shape) < 0.01,
        "truncated": np.zeros,
        "discount": lambda shape: np.full(shape, 0.99),
    }
    replay.add(Transitions(*(
        special.get(name, rng.standard_normal)((BUFFER, *array.shape[1:])).astype(array.dtype)
        for name, array in zip(Transitions._fields, replay.storage, strict=True)
    )))
    return replay


def make_contenders(obs_dim: int, act_dim: int, updates: int):
    spec = load_spec(SPECS / "sac_pendulum.yaml", ["algo.batch_size=256", "algo.actor_hidden_dims=[256, 256]",
        "algo.critic_hidden_dims=[256, 256]"])
    per_call = spec.algo.train_every * spec.algo.utd_ratio  # updates per Learner.update call
    calls = max(1, updates // per_call)
    n_updates = calls * per_call
    learner = Learner(spec, obs_dim, act_dim)
    replay = random_replay(obs_dim, act_dim)
    data = Transitions(*(stored[: replay.size] for stored in replay.storage))
    ref = ReferenceSAC(obs_dim, act_dim, data)
    ref_fused = ReferenceSAC(obs_dim, act_dim, data, fused=True)
    torch.set_num_threads(1)  # Learner sets it from the spec (1); make the intent explicit

    fixed = Batch.from_transitions(replay.sample(per_call, BATCH), learner.device)
    utd = spec.algo.utd_ratio
    # what Learner.update hands the algorithm: one utd-sized slice of the stack per fleet step
    fixed_steps = [Batch(*(t[i * utd : (i + 1) * utd] for t in fixed)) for i in range(per_call // utd)]
    fixed_ref = ref.sample()

    def ours() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            learner.update([], replay.sample_for_learners(per_call, BATCH, 1))
        return n_updates / (time.perf_counter() - start)

    def reference() -> float:
        start = time.perf_counter()
        for _ in range(n_updates):
            ref.update(*ref.sample())
        return n_updates / (time.perf_counter() - start)

    def ours_compute() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            for step in fixed_steps:
                learner.algo.update(step)
        return n_updates / (time.perf_counter() - start)

    def reference_compute() -> float:
        start = time.perf_counter()
        for _ in range(n_updates):
            ref.update(*fixed_ref)
        return n_updates / (time.perf_counter() - start)

    def reference_fused_compute() -> float:
        start = time.perf_counter()
        for _ in range(n_updates):
            ref_fused.update(*fixed_ref)
        return n_updates / (time.perf_counter() - start)

    contenders = [
        ("ours", ours), ("reference", reference),
        ("ours (update only)", ours_compute), ("reference (update only)", reference_compute),
        ("ref fused Adam (update only)", reference_fused_compute),
    ]
    parts = {"learner": learner, "ref": ref, "ref_fused": ref_fused, "steps": fixed_steps, "ref_batch": fixed_ref,
             "per_call": per_call, "n_updates": n_updates}
    return contenders, parts


def profile(parts: dict) -> None:
    """torch.profiler op tables (by self CPU time) of the three update-only contenders."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    learner, steps, batch, n = parts["learner"], parts["steps"], parts["ref_batch"], parts["per_call"]
    for name, step in (
        ("ours: SAC.update, one fleet step at a time", lambda: [learner.algo.update(b) for b in steps]),
        ("reference: ReferenceSAC.update", lambda: [parts["ref"].update(*batch) for _ in range(n)]),
        ("reference, fused Adam", lambda: [parts["ref_fused"].update(*batch) for _ in range(n)]),
    ):
        for _ in range(5):
            step()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                step()
        print(f"\n## torch.profiler: {name} ({10 * n} updates), by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], reps=8)
    parser.add_argument("--updates", type=int, default=80, help="updates per contender per repetition")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables of the updates")
    parser.add_argument("--flush-denormal", action="store_true",
                        help="torch.set_flush_denormal(True) for every contender (see check_denormals.py)")
    args = parser.parse_args()
    dims = DIMS
    if args.smoke:  # one learner call per contender, Pendulum's dims
        args.reps, args.updates, dims = 1, 16, dict(list(DIMS.items())[:1])
    torch.set_num_threads(1)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    info = machine_info()
    print_machine(info)
    print(f"# batch {BATCH}, 256x256 MLPs, torch threads {torch.get_num_threads()}, {args.reps} reps, "
          f"alternating A B C / C B A, flush_denormal={args.flush_denormal}")

    rows, results = [], {}
    for label, (obs_dim, act_dim) in dims.items():
        contenders, parts = make_contenders(obs_dim, act_dim, args.updates)
        if not args.smoke:  # a smoke cell's rates are no result: it needs no warm-up
            for _, fn in contenders:  # warm-up outside the timed repetitions (Adam state, allocator)
                fn()
        print(f"\n{label}: {parts['n_updates']} updates per timing, "
              f"ours calls Learner.update({parts['per_call']} batches)")
        rates = alternate(contenders, args.reps)
        ratio = median_ratio(rates, "ours", "reference")
        ratio_compute = median_ratio(rates, "ours (update only)", "reference (update only)")
        ratio_fused = median_ratio(rates, "ours (update only)", "ref fused Adam (update only)")
        med = {k: float(np.median(v)) for k, v in rates.items()}
        rows.append([label, med["ours"], med["reference"], ratio, med["ours (update only)"],
                     med["reference (update only)"], ratio_compute, med["ref fused Adam (update only)"], ratio_fused])
        results[label] = {"rates": rates, "median": med, "ratio": ratio, "ratio_update_only": ratio_compute,
                          "ratio_update_only_vs_fused_ref": ratio_fused}
        if args.profile:
            profile(parts)

    print("\nupdates/s (median over reps); ratio = median of per-rep ours/reference")
    print_table(
        ["dims obs/act", "ours upd/s", "ref upd/s", "ours/ref", "ours upd-only", "ref upd-only", "ours/ref upd-only",
         "ref-fused upd-only", "ours/ref-fused upd-only"],
        rows,
    )
    write_json(args.json, {"bench": "learner", "machine": info, "command": command_line(), "results": results,
                           "flush_denormal": args.flush_denormal})


if __name__ == "__main__":
    main()
