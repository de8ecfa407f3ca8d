"""Env construction (`aa_ray.envs.make`) and offscreen rendering: a user gets one paragraph, a
developer keeps the real error and its traceback, and a real bug is never passed off as a missing
GL backend."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from aa_ray.envs import env_dims
from aa_ray.errors import SpecError
from aa_ray.runtime.env_runner import EnvRunner
from aa_ray.spec.loader import validate_spec

ROOT = Path(__file__).resolve().parents[1]


class BrokenEnv(gym.Env):
    def __init__(self, gain: float = -1.0):
        raise ValueError(f"gain must be positive, got {gain}")


class PaintedEnv(gym.Env):
    """Renders a flat frame without any GL; `step` raises at `fail_at_step` (a bug in the env)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, render_mode: str | None = None, fail_at_step: int | None = None):
        self.render_mode, self.fail_at_step, self.t = render_mode, fail_at_step, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.fail_at_step:
            raise ZeroDivisionError("a bug in the env's step")
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def render(self):
        return np.full((8, 8, 3), 40 * self.t % 255, np.uint8)


gym.register("aa_ray_tests/Broken-v0", entry_point=BrokenEnv)
gym.register("aa_ray_tests/Painted-v0", entry_point=PaintedEnv, max_episode_steps=20)


def spec_for(env_id: str, **kwargs):
    return validate_spec({
        "name": "envs", "env": {"id": env_id, "kwargs": kwargs},
        "algo": {"name": "sac", "warm_up_steps": 10, "batch_size": 8, "buffer_size": 100},
        "budget": {"env_steps": 1000},
    })


def test_an_env_that_cannot_be_made_is_one_paragraph_and_keeps_its_cause() -> None:
    with pytest.raises(SpecError) as caught:
        env_dims(spec_for("aa_ray_tests/Broken-v0", gain=-2.0))
    message = str(caught.value)
    assert "could not make 'aa_ray_tests/Broken-v0'" in message and "gain must be positive, got -2.0" in message
    assert "\n" not in message
    cause = caught.value.__cause__
    assert isinstance(cause, ValueError)
    frames = traceback.extract_tb(cause.__traceback__)
    assert frames[-1].name == "__init__" and frames[-1].filename == __file__  # down to the constructor's line


def test_a_video_is_the_rendered_eval_episode() -> None:
    runner = EnvRunner(spec_for("aa_ray_tests/Painted-v0"), index=0)
    video, problem = runner.record_video(max_frames=5)
    assert problem is None and video[:6] == b"GIF89a"


def test_a_bug_while_recording_a_video_is_raised_not_called_a_missing_backend() -> None:
    runner = EnvRunner(spec_for("aa_ray_tests/Painted-v0", fail_at_step=3), index=0)
    with pytest.raises(ZeroDivisionError, match="a bug in the env's step"):
        runner.record_video(max_frames=10)


def run_python(code: str, **env: str | None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in env}
    environ |= {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=environ)


def test_without_a_gl_backend_the_video_is_skipped_with_the_reason() -> None:
    """No MUJOCO_GL and no display: MuJoCo cannot make a GL context; the runner says so and carries on."""
    result = run_python(
        "from aa_ray.runtime.env_runner import EnvRunner\n"
        "from aa_ray.spec.loader import load_spec\n"
        "runner = EnvRunner(load_spec('specs/sac.yaml'), index=0)\n"
        "video, problem = runner.record_video(max_frames=3)\n"
        "assert video is None, 'rendered after all'\n"
        "print(problem)\n",
        MUJOCO_GL=None, DISPLAY=None,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "eval video skipped: cannot render aa_ray/PusherReach-v0 offscreen (FatalError:" in result.stdout


def test_a_gl_backend_mujoco_cannot_load_is_a_spec_error_naming_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aa_ray.cli", "validate", "specs/sac.yaml"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "MUJOCO_GL": "no-such-backend"},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "cannot import MuJoCo" in result.stderr and "MUJOCO_GL=no-such-backend is set" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bug_in_aa_ray_envs_is_raised_as_itself() -> None:
    """An import error inside aa_ray.envs (here: its pusher module cannot be imported) is a bug to
    see with its traceback, not a MuJoCo installation problem."""
    result = run_python(
        "import sys\n"
        "sys.modules['aa_ray.envs.pusher_reach'] = None\n"
        "from aa_ray.spec.loader import load_spec\n"
        "load_spec('specs/sac.yaml')\n"
    )
    assert result.returncode == 1
    assert "ModuleNotFoundError" in result.stderr and "aa_ray.envs.pusher_reach" in result.stderr
    assert "SpecError" not in result.stderr and "cannot import" not in result.stderr and "Traceback" in result.stderr
