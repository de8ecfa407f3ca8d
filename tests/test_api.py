"""The Python API (`aa_ray.api`), `aa-ray eval` and `aa-ray export`.

The README's API example runs as written (on the embedded Ray, a real MLflow store in a temp dir),
and its policy's actions equal those of the same spec trained by `aa-ray run`: one code path.
`aa-ray eval` repeats a run's last evaluation exactly; `aa-ray export` writes TorchScript and ONNX
files that load without aa-ray and act as the checkpoint's policy does, for sac, sac_simba, td3
and ppo. Bad input fails with one message and writes nothing."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from aa_ray import cli
from aa_ray.api import Experiment, Report, load_policy
from aa_ray.errors import SpecError
from aa_ray.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
INLINE = {"runtime.backend": "inline", "tracking.enabled": False, "runners.num_runners": 1}


def readme_example() -> str:
    """The README's Python block (between the api-example markers)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md has no <!-- api-example --> python block"
    return block.group(1)


def final_checkpoint(folder: Path) -> Path:
    (checkpoint,) = folder.glob("runs/*/checkpoints/final")
    return checkpoint


def test_readme_example_trains_like_the_cli_and_eval_repeats_the_last_evaluation(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same spec and overrides through the API (the README's code, on the embedded Ray) and through
    `aa-ray run` (inline: it repeats a Ray sync run exactly, tests/test_inline_backend.py): sync mode is
    reproducible, so the two final policies act identically; `aa-ray eval` of the CLI's checkpoint
    reports the distance of that run's last evaluation."""
    api_dir, cli_dir = tmp_path / "api", tmp_path / "cli"
    for folder in (api_dir, cli_dir):
        folder.mkdir()
        (folder / "specs").symlink_to(SPECS)
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}  # ./mlflow.db
    example = subprocess.run([sys.executable, "-c", readme_example()], cwd=api_dir, capture_output=True, text=True,
                             timeout=600, env=env)
    assert example.returncode == 0, example.stderr[-3000:]
    overrides = re.search(r"Experiment\(\"specs/sac.yaml\", (\{.*?\})\)", readme_example(), re.S).group(1)
    settings = [f"{key}={value}" for key, value in ast.literal_eval(overrides).items()]  # the example's own
    settings.append("runtime.backend=inline")
    run = subprocess.run([sys.executable, "-m", "aa_ray.cli", "run", "specs/sac.yaml", "--plain",
                          *[arg for s in settings for arg in ("--set", s)]],
                         cwd=cli_dir, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]

    api_policy, cli_policy = load_policy(final_checkpoint(api_dir)), load_policy(final_checkpoint(cli_dir))
    obs = np.random.default_rng(0).normal(size=(64, api_policy.obs_dim)).astype(np.float32)
    np.testing.assert_array_equal(api_policy.predict(obs), cli_policy.predict(obs))
    # the callback saw each evaluation (every 500 steps), then the budget ended the run
    assert len(re.findall(r"\d+ env steps: eval/distance", example.stdout)) == 3, example.stdout
    assert re.search(r"^budget .*checkpoints/final", example.stdout, re.M), example.stdout

    client = MlflowClient(f"sqlite:///{cli_dir / 'mlflow.db'}")
    (tracked,) = client.search_runs([client.get_experiment_by_name("aa-ray").experiment_id])
    history = sorted(client.get_metric_history(tracked.info.run_id, "eval/distance"), key=lambda p: p.step)
    # in this process: eval reads only the checkpoint (no store), and `python -m aa_ray.cli` ran above
    monkeypatch.chdir(cli_dir)
    capsys.readouterr()
    assert cli.main(["eval", str(final_checkpoint(cli_dir))]) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    shown = float(re.search(r"eval/distance (\S+)", printed).group(1))
    assert shown == pytest.approx(history[-1].value, rel=1e-3), printed


EXPORT_SPECS = ["sac.yaml", "sac_simba.yaml", "td3.yaml", "ppo.yaml"]
# One interpreter in which aa_ray cannot be imported loads every exported file (torch and onnxruntime
# start once, not once per spec); a file that fails to load leaves its traceback, so only its spec's
# test fails.
LOADER = """
import sys; sys.modules["aa_ray"] = None
import json, traceback
import numpy as np, onnxruntime, torch
for folder in json.loads(sys.argv[1]):
    obs = np.load(f"{folder}/obs.npy")
    for fmt, act in (("torchscript", lambda path: torch.jit.load(path)(torch.from_numpy(obs)).numpy()),
                     ("onnx", lambda path: onnxruntime.InferenceSession(path).run(None, {"obs": obs})[0])):
        try:
            np.save(f"{folder}/{fmt}.npy", act(f"{folder}/policy.{fmt}"))
        except Exception:
            with open(f"{folder}/{fmt}.error", "w") as error:
                error.write(traceback.format_exc())
"""


def train_and_export(spec_file: str, folder: Path) -> tuple[Any, np.ndarray, Path]:
    """A short run of the spec with a normalizer, its checkpoint exported in both formats to
    `folder`, and the observations the files will act on."""
    short = {"algo.train_every": 16} if spec_file == "ppo.yaml" else {"algo.warm_up_steps": 100}  # ppo: 16 x 16 envs
    overrides = {**INLINE, **short, "runtime.output_dir": str(folder / "runs"), "budget.env_steps": 400,
                 "checkpoint.every_env_steps": None, "algo.normalize_obs": True}
    checkpoint = Experiment(SPECS / spec_file, overrides).fit(progress="plain").checkpoint
    for fmt in ("torchscript", "onnx"):
        assert cli.main(["export", str(checkpoint), "--format", fmt, "--out", str(folder / f"policy.{fmt}")]) == 0
    policy = load_policy(checkpoint)
    obs = np.random.default_rng(1).normal(size=(32, policy.obs_dim)).astype(np.float32) * 3
    np.save(folder / "obs.npy", obs)
    return policy, obs, folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, np.ndarray, Path]]:
    """Per spec: its trained policy, the observations, and the folder where the loader left what
    the TorchScript and ONNX files of the policy made of them."""
    root = tmp_path_factory.mktemp("export")
    made = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # module fixtures run before each test's own folder is made current
        for spec_file in EXPORT_SPECS:
            try:
                made[spec_file] = train_and_export(spec_file, root / Path(spec_file).stem)
            except Exception as err:
                err.add_note(f"(training and exporting {spec_file})")
                raise
        folders = json.dumps([str(folder) for _, _, folder in made.values()])
        loaded = subprocess.run([sys.executable, "-c", LOADER, folders], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return made


@pytest.mark.parametrize("spec_file", EXPORT_SPECS)
def test_export_round_trips_through_torchscript_and_onnx_without_aa_ray(
        spec_file: str, exported: dict[str, tuple[Any, np.ndarray, Path]]) -> None:
    """`aa-ray export` of a policy trained with a normalizer: both files, loaded where aa_ray cannot
    be imported, act on the observations as the checkpoint's policy does, within the action bounds."""
    policy, obs, folder = exported[spec_file]
    assert float(policy.network.obs_norm.count) > 0  # a trained normalizer, which the files must carry
    expected = policy.predict(obs)
    for fmt in ("torchscript", "onnx"):
        error = folder / f"{fmt}.error"
        assert not error.exists(), f"{spec_file} {fmt}:\n{error.read_text()[-3000:]}"
        np.testing.assert_allclose(np.load(folder / f"{fmt}.npy"), expected, atol=1e-5, err_msg=f"{spec_file} {fmt}")
    low, high = policy.bounded.low.numpy(), policy.bounded.high.numpy()
    assert np.all(expected >= low - 1e-6) and np.all(expected <= high + 1e-6), spec_file
    assert not np.allclose(expected, expected[0]), spec_file  # it acts on the observations, not a constant


def test_a_callback_sees_each_report_and_can_stop_the_run(tmp_path: Path) -> None:
    reports: list[Report] = []

    def stop_at_the_first_checkpoint(report: Report) -> bool:
        reports.append(report)
        return report.checkpoint is not None

    experiment = Experiment(SPECS / "sac.yaml", {
        **INLINE, "runtime.output_dir": str(tmp_path), "budget.env_steps": 2000, "algo.warm_up_steps": 100,
        "eval.every_env_steps": 200, "eval.episodes": 2, "checkpoint.every_env_steps": 500,
    })
    result = experiment.fit(callbacks=[stop_at_the_first_checkpoint], progress="plain")
    assert result.stop_reason == "stopped by a callback" and 500 <= result.env_steps < 2000
    assert [r.checkpoint is not None for r in reports] == [False, False, True, True]  # 2 evals, the stop, final
    assert reports[-1].final and reports[-1].checkpoint == result.checkpoint and result.checkpoint.is_dir()
    assert all("eval/return" in r.metrics for r in reports) and result.metrics == result.evals[-1]
    policy = load_policy(result.checkpoint)
    assert policy.predict(np.zeros(policy.obs_dim)).shape == (policy.act_dim,)


def test_an_experiment_of_a_validated_spec_keeps_its_values() -> None:
    """`aa-ray run` hands its validated spec to `Experiment`: its values arrive as they were (no trip
    through JSON), and what the file's loader refuses, a NaN in env.kwargs, the API refuses too."""
    spec = load_spec(SPECS / "sac_pendulum.yaml", ["env.kwargs={g: 9.5}", "algo.utd_ratio=2"])
    kept = Experiment(spec).spec
    assert kept.env.kwargs == {"g": 9.5} and kept.algo == spec.algo
    assert Experiment(spec, {"algo.utd_ratio": 3}).spec.algo.utd_ratio == 3
    with pytest.raises(SpecError, match="kwargs\\['g'\\] is nan"):
        Experiment(spec, {"env.kwargs": {"g": float("nan")}})


@pytest.mark.fresh_store  # it checks what its folder holds
def test_bad_input_gets_one_message_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "state.pt").write_bytes(b"not a torch file")
    out = tmp_path / "policy.onnx"
    cases = [
        (["eval", str(tmp_path / "missing")], "not found"),
        (["export", str(tmp_path / "missing"), "--format", "onnx", "--out", str(out)], "not found"),
        (["export", str(foreign), "--format", "onnx", "--out", str(out)], "not an aa-ray checkpoint"),
        (["eval", str(foreign)], "not an aa-ray checkpoint"),
    ]
    for argv, expected in cases:
        assert cli.main(argv) == 2, argv
        error = capsys.readouterr().err
        assert expected in error and "Traceback" not in error and error.count("\n") == 1, error
    with pytest.raises(SystemExit) as exit_info:  # argparse names the allowed formats
        cli.main(["export", str(foreign), "--format", "tflite", "--out", str(out)])
    assert exit_info.value.code == 2 and "torchscript" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]

    with pytest.raises(SpecError, match="budget.env_steps"):
        Experiment(SPECS / "sac.yaml", {"budget.env_steps": "many"})
    with pytest.raises(SpecError, match="algo.no_such_knob"):
        Experiment(SPECS / "sac.yaml", ["algo.no_such_knob=1"])
