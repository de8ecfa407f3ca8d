"""Plot what `benchmarks/bench_scale.py` measured (its --json files) into one figure:
the runtime's ceiling per runner and envs per runner, scaling efficiency per node count, and the
simulated GPU's busy fraction per UTD (updates x update time / wall).

    .venv/bin/python benchmarks/plot_scale.py --ceiling c.json --efficiency e.json --gpu g.json \\
        [--gpu-after g2.json] --out benchmarks/figures/scale.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def cells(path: Path | None, part: str) -> list[dict[str, Any]]:
    if path is None:
        return []
    return [c for c in json.loads(path.read_text()).get(part, []) if c["status"] == "ok"]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for part in ("ceiling", "efficiency", "gpu", "gpu-after"):
        parser.add_argument(f"--{part}", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    by_envs: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for c in cells(args.ceiling, "ceiling"):
        by_envs[c["config"]["envs"]].append((c["config"]["runners"], c["env_steps_per_s"]))
    for envs, points in sorted(by_envs.items()):
        left.plot(*zip(*sorted(points), strict=True), marker="o", label=f"{envs} envs per runner")
    left.set(xscale="log", yscale="log", xlabel="env runners", ylabel="env steps/s",
             title="ceiling: zero-cost env and learner")
    left.legend(fontsize=8)

    by_nodes: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for c in cells(args.efficiency, "efficiency"):
        by_nodes[c["config"]["nodes"]].append((c["config"]["runners"], c["env_steps_per_s"] / c["config"]["ideal"]))
    for nodes, points in sorted(by_nodes.items()):
        middle.plot(*zip(*sorted(points), strict=True), marker="o", label=f"{nodes} node(s)")
    middle.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    middle.set(xscale="log", ylim=(0, 1.05), xlabel="env runners", ylabel="measured / ideal",
               title="scaling efficiency, 2 ms env step")
    middle.legend(fontsize=8)

    for label, path in (("before", args.gpu), ("after", args.gpu_after)):  # same harness settings on both
        for mode in ("sync", "async"):
            points = sorted((c["config"]["utd"], c["device_busy"]) for c in cells(path, "gpu")
                            if c["config"].get("mode", "sync") == mode)
            if points:
                right.plot(*zip(*points, strict=True), marker="o", label=f"{label}, {mode}")
    right.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    right.set(xscale="log", ylim=(0, 1.05), xlabel="UTD", ylabel="simulated GPU busy",
              title="GPU learner (1.4 ms/update), batch 8192, 32 runners")
    right.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
