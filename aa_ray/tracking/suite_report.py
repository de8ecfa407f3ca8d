"""`aa-ray report --parent SUITE_RUN`: a benchmark suite against published results.

- One panel per env: the median and min-max band over seeds of each spec label (and of any other
  contender logged under the suite, e.g. `benchmarks/bench_sb3_suite.py`'s SB3 runs) against env
  steps, with the published returns of the same algorithms drawn as markers at their step counts;
  and the same curves against each run's own wall-clock minutes (`curves.py`).
- A table of ours vs published at equal steps (ours: the median over seeds of each seed's curve
  read at that step; only steps every seed reached).
- Minutes to reach X per env and label: the median over seeds of the minutes until a seed reached X
  after it started learning and held it (`curves.reached`; a seed that never did counts as later
  than any that did), with the untrained policy's return beside it, X being `--threshold`
  when given, else the SB3 contender's median return at the env steps all its seeds reached (its
  budget, once finished). With the CPU the runs ran on and how many ran at once.
- Across envs, as the field now aggregates: the interquartile mean of normalized scores,
  (return - random) / (reference - random), at the env steps every run reached, with 95%
  stratified-bootstrap confidence intervals (`rliable`).

The published values come from the references file the suite names (logged with the parent run).
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from aa_ray.spec.yaml_files import read_yaml_file
from aa_ray.tracking import curves as learning_curves
from aa_ray.tracking.curves import Curve, ReportError
from aa_ray.tracking.mlflow_tracker import PARENT_TAG, search_all_runs

# the tags a suite's child runs carry (`aa_ray.tune.suite` writes them; other contenders may too)
LABEL_TAG, ENV_TAG = "aa_ray.suite_label", "aa_ray.suite_env"
SUPERSEDED_TAG = "aa_ray.superseded"  # a child run whose cell has changed since: left out
REFERENCES_TAG = "aa_ray.references"  # the references file's name among the parent's artifacts
BOOTSTRAP_REPS = 2000
# the contender whose return is the default X of "minutes to reach X" (benchmarks/bench_sb3_suite.py)
CONTENDER_PARAM, REFERENCE_CONTENDER = "contender", "stable-baselines3"


def env_family(env_id: str) -> str:
    """HalfCheetah-v5 -> HalfCheetah: published results name the task, their version differs."""
    return env_id.rsplit("/", 1)[-1].rsplit("-v", 1)[0]


def suite_runs(client: MlflowClient, parent: str) -> list[Run]:
    experiment_id = client.get_run(parent).info.experiment_id
    children = search_all_runs(client, [experiment_id], f"tags.`{PARENT_TAG}` = '{parent}'")
    return [run for run in children if LABEL_TAG in run.data.tags and SUPERSEDED_TAG not in run.data.tags]


def load_references(client: MlflowClient, parent: str) -> dict[str, Any]:
    name = client.get_run(parent).data.tags.get(REFERENCES_TAG)
    if not name:
        return {"returns": [], "normalization": {}}
    with tempfile.TemporaryDirectory() as folder:
        path = client.download_artifacts(parent, name, folder)
        return read_yaml_file(Path(path)) or {}  # the suite's own file, read with the same limits


def curve_at(curve: Curve, step: float) -> float:
    return float(np.interp(step, curve.steps, curve.values))


def comparison_rows(curves: dict[tuple[str, str], list[Curve]], algos: dict[str, str],
                    references: list[dict]) -> list[dict]:
    """Ours vs published at each published step that every seed of ours reached."""
    rows = []
    for (label, env_id), group in sorted(curves.items()):
        reached = min(c.steps.max() for c in group)
        for ref in references:
            if ref["algo"] != algos[label] or ref["env"] != env_family(env_id) or ref["env_steps"] > reached:
                continue
            ours = float(np.median([curve_at(c, ref["env_steps"]) for c in group]))
            rows.append({"env": env_id, "ours": label, "env_steps": int(ref["env_steps"]), "ours_median": ours,
                         "seeds": len(group), "published": float(ref["return"]),
                         "published_by": f"{ref.get('source_label', '')} {ref.get('variant', '')}".strip(),
                         "published_env": f"{ref['env']}-{ref.get('env_version', '?')}",
                         "ours/published": ours / ref["return"] if ref["return"] else None})
    return rows


def reach_targets(curves: dict[tuple[str, str], list[Curve]], reference_labels: set[str],
                  threshold: float | None) -> dict[str, tuple[float, str]]:
    """Per env, the return X to reach and where it comes from: the user's threshold, else the
    reference contender's median over seeds at the env steps every one of its seeds reached."""
    targets = {}
    for env_id in sorted({env for _, env in curves}):
        if threshold is not None:
            targets[env_id] = (threshold, "--threshold")
            continue
        for label in sorted(reference_labels):
            group = curves.get((label, env_id))
            if group:
                budget = min(c.steps.max() for c in group)
                value = float(np.median([curve_at(c, budget) for c in group]))
                targets[env_id] = (value, f"{label} median at {int(budget):,} env steps")
                break
    return targets


def minutes_rows(curves: dict[tuple[str, str], list[Curve]], targets: dict[str, tuple[float, str]],
                 at_once: dict[str, int]) -> list[dict]:
    rows = []
    for (label, env_id), group in sorted(curves.items(), key=lambda item: (item[0][1], item[0][0])):
        if env_id not in targets:
            continue
        target, source = targets[env_id]
        reach = learning_curves.reach_columns(group, target)
        rows.append({"env": env_id, "label": label, "X": target, "X_is": source,
                     "minutes_to_reach_X": reach["minutes_to_reach_X"], "reached": reach["reached"],
                     "untrained_return": reach["untrained_return"],
                     "minutes_run_median": float(np.median([c.minutes.max() for c in group])),
                     "runs_at_once": max(at_once[c.run_id] for c in group), "note": reach["note"]})
    return rows


def normalized_scores(curves: dict[tuple[str, str], list[Curve]], normalization: dict[str, dict]
                      ) -> tuple[dict[str, np.ndarray], list[str], dict[str, float]]:
    """Per label, a (seeds, envs) array of normalized scores at the steps every run of an env reached."""
    envs = sorted({env for _, env in curves if env_family(env) in normalization})
    if not envs:  # no normalization constants (a suite without references): no scores
        return {}, [], {}
    labels = sorted({label for label, _ in curves})
    common = {env: min(c.steps.max() for (_, e), group in curves.items() if e == env for c in group) for env in envs}
    scores = {}
    for label in labels:
        if not all((label, env) in curves for env in envs):
            continue  # rliable needs every env for every label
        seeds = min(len(curves[label, env]) for env in envs)
        columns = []
        for env in envs:
            norm = normalization[env_family(env)]
            raw = np.array([curve_at(c, common[env]) for c in curves[label, env][:seeds]])
            columns.append((raw - norm["random"]) / (norm["reference"] - norm["random"]))
        if columns:
            scores[label] = np.stack(columns, axis=1)
    return scores, envs, common


def iqm_rows(scores: dict[str, np.ndarray], seed: int = 0) -> list[dict]:
    from rliable import library as rly
    from rliable import metrics

    if not scores:
        return []
    np.random.seed(seed)  # rliable's bootstrap draws from numpy's global generator
    point, interval = rly.get_interval_estimates(
        scores, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=BOOTSTRAP_REPS
    )
    return [{"ours": label, "runs": int(scores[label].shape[0]), "envs": int(scores[label].shape[1]),
             "iqm_normalized": float(point[label][0]), "ci95_low": float(interval[label][0][0]),
             "ci95_high": float(interval[label][1][0])} for label in scores]


def plot_suite(data: dict[str, dict[str, dict]], references: dict[str, list[dict]], iqm: list[dict],
               path: Path, xlabel: str = "env steps") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(data) + (1 if iqm else 0)
    cols = min(3, panels)
    rows = -(-panels // cols)
    figure, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    flat = list(axes.flat)
    colors = {}
    for ax, (env_id, by_label) in zip(flat, sorted(data.items()), strict=False):
        right = 0.0
        for label, curve in sorted(by_label.items()):
            (line,) = ax.plot(curve["x"], curve["median"], label=f"{label} (median, {curve['seeds']} seeds)")
            colors[label] = line.get_color()
            ax.fill_between(curve["x"], curve["low"], curve["high"], color=line.get_color(), alpha=0.2)
            right = max(right, max(curve["x"]))
        shown = [ref for ref in references.get(env_id, []) if ref["env_steps"] <= right * 1.05]
        for ref in shown:
            ax.plot(ref["env_steps"], ref["return"], marker="D", linestyle="none", color="black", markersize=4)
        if shown:
            ax.plot([], [], marker="D", linestyle="none", color="black", markersize=4, label="published")
        ax.set_title(env_id)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if iqm:
        ax = flat[len(data)]
        names = [row["ours"] for row in iqm]
        centers = [row["iqm_normalized"] for row in iqm]
        errors = [[c - row["ci95_low"] for c, row in zip(centers, iqm, strict=True)],
                  [row["ci95_high"] - c for c, row in zip(centers, iqm, strict=True)]]
        ax.barh(names, centers, xerr=errors, color=[colors.get(n, "gray") for n in names], alpha=0.7, capsize=4)
        ax.set_title("IQM of normalized score (95% CI)")
        ax.set_xlabel("(return - random) / (reference - random)")
        ax.grid(alpha=0.3, axis="x")
    for ax in flat[panels:]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path.read_bytes()


def make_suite_report(client: MlflowClient, out: Path, parent: str, metric: str,
                      threshold: float | None = None) -> dict[str, Any]:
    runs = suite_runs(client, parent)
    if not runs:
        raise ReportError(f"suite run {parent} has no child runs yet (run the suite first)")
    curves: dict[tuple[str, str], list[Curve]] = {}
    algos: dict[str, str] = {}
    reference_labels: set[str] = set()
    for run in runs:
        curve = learning_curves.load_curve(client, run, metric)
        if curve is None:
            continue
        label, env_id = run.data.tags[LABEL_TAG], run.data.tags[ENV_TAG]
        curves.setdefault((label, env_id), []).append(curve)
        algos[label] = run.data.params.get("algo.name", label)
        if run.data.params.get(CONTENDER_PARAM, "").startswith(REFERENCE_CONTENDER):
            reference_labels.add(label)
    if not curves:
        raise ReportError(f"none of the {len(runs)} runs of suite {parent} logged {metric!r}")
    published = load_references(client, parent)
    returns = published.get("returns") or []
    data: dict[str, dict[str, dict]] = {}
    by_minutes: dict[str, dict[str, dict]] = {}
    for (label, env_id), group in curves.items():
        data.setdefault(env_id, {})[label] = {**learning_curves.aggregate(group, "steps"), "seeds": len(group),
                                              "runs": [c.run_id for c in group]}
        by_minutes.setdefault(env_id, {})[label] = {**learning_curves.aggregate(group, "minutes"),
                                                    "seeds": len(group)}
    markers = {env_id: [ref for ref in returns if ref["env"] == env_family(env_id)
                        and ref["algo"] in {algos[label] for label in by_label}]
               for env_id, by_label in data.items()}
    rows = comparison_rows(curves, algos, returns)
    scores, envs, common = normalized_scores(curves, published.get("normalization") or {})
    iqm = iqm_rows(scores)
    reported = [run for run in runs if any(c.run_id == run.info.run_id for group in curves.values() for c in group)]
    at_once = learning_curves.runs_at_once(reported, [c for group in curves.values() for c in group])
    minutes = minutes_rows(curves, reach_targets(curves, reference_labels, threshold), at_once)
    machine = learning_curves.machine_note(reported, at_once)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_suite(data, markers, iqm, out / "report.png")
    png_time = plot_suite(by_minutes, {}, [], out / "report_time.png", "minutes since the run started (stops left out)")
    title = f"aa-ray suite report: {metric} ({datetime.now():%Y-%m-%d %H:%M})"
    tables = {"Ours vs published at equal env steps": rows,
              "Minutes to reach X (each run's own wall-clock)": minutes,
              "Interquartile mean of normalized scores across envs": iqm,
              "Env steps of the normalized scores": [{"env": e, "env_steps": int(common[e])} for e in envs]}
    learning_curves.write_html(out / "report.html", title, [png, png_time], tables, data, runs,
                               [machine, learning_curves.REACH_RULE])
    summary = {"metric": metric, "comparison": rows, "minutes_to_reach": minutes, "machine": machine, "iqm": iqm,
               "score_steps": common, "curves": data, "curves_by_minutes": by_minutes, "markers": markers}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name in ("report.png", "report_time.png", "report.html", "summary.json"):
        client.log_artifact(parent, str(out / name), "report")
    return {"png": out / "report.png", "html": out / "report.html", "rows": rows, "iqm": iqm, "groups": len(curves),
            "minutes": minutes, "machine": machine}
