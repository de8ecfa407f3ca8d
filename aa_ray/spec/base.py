"""The pydantic base shared by every spec model: unknown keys are errors, specs are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    """A frozen spec section that rejects keys it does not know (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
