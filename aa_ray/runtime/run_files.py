"""What the driver writes into the run folder besides checkpoints: `events.jsonl` (restarts and
other runtime events, one JSON object per line; an MLflow artifact at the end of the run) and the
evaluation videos (`videos/eval_<env steps>.gif`)."""

from __future__ import annotations

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


def write_video(run_dir: Path, env_steps: int, video: bytes) -> Path:
    path = run_dir / "videos" / f"eval_{env_steps:09d}.gif"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(video)
    return path
