"""What the driver writes into the run folder besides checkpoints: `events.jsonl` (restarts and
other runtime events, one JSON object per line; an MLflow artifact at the end of the run) and the
evaluation videos (`videos/eval_<env steps>.gif`, encoded here from the runners' frames)."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def write_event(run_dir: Path, kind: str, env_steps: int, **details: Any) -> str:
    """Append an event to the run's events.jsonl; returns the line to show the user."""
    event = {"time": datetime.now().isoformat(timespec="seconds"), "env_steps": env_steps, "event": kind, **details}
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / EVENTS_FILE, "a") as events:
        events.write(json.dumps(event) + "\n")
    return f"event: {kind} " + ", ".join(f"{key}={value}" for key, value in details.items())


def cannot_render(env_id: str, err: Exception) -> str:
    """Why an eval video was skipped, when making the offscreen renderer failed with `err`."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (f"eval video skipped: cannot render {env_id} offscreen ({type(err).__name__}: {reason}); install a GL "
            "backend and set MUJOCO_GL=egl or osmesa, or set eval.video: false")


def gif_bytes(frames: list[Any], fps: float) -> bytes:
    """RGB frames (H x W x 3 uint8 arrays) as an endlessly looping GIF at `fps`."""
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames if frame is not None]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


def write_video(run_dir: Path, env_steps: int, video: bytes) -> Path:
    path = run_dir / "videos" / f"eval_{env_steps:09d}.gif"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(video)
    return path
