"""The pydantic base shared by every spec model: unknown keys are errors, specs are frozen, numbers
are finite, and a count or a switch takes only a number or a boolean of its own kind."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema


def _strict_counts_and_switches(schema: Any) -> Any:
    """The core schema with every int and bool in it strict and every float refusing a bool, changed
    in place. Pydantic's lax mode would read `batch_size: true` as 1, `enabled: "yes"` or `1` as
    True, `utd_ratio: 2.5` as an error but `2.0` as 2, and `lr: true` as 1.0; each is a mistake to
    report, not to guess. The whole model cannot be strict: that would refuse YAML's lists for tuple
    fields and numeric strings ("1e-3") for floats."""
    if isinstance(schema, dict):
        if schema.get("type") in ("int", "bool"):
            schema["strict"] = True
        if schema.get("type") == "function-before" and schema["function"].get("function") is _not_a_bool:
            return schema  # a float made to refuse bools already (a nested model's schema is reused)
        children = schema.items()
    elif isinstance(schema, list):
        children = enumerate(schema)
    else:
        return schema
    for key, child in list(children):
        if isinstance(child, dict) and child.get("type") == "float":
            schema[key] = core_schema.no_info_before_validator_function(_not_a_bool, child)
        else:
            _strict_counts_and_switches(child)
    return schema


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


class SpecModel(BaseModel):
    """A frozen spec section that rejects keys it does not know (typos must not pass silently).

    Its floats refuse inf and nan (YAML's .inf, .nan and an overflowing 1e999 included): a spec has
    no knob that may be infinite, and a non-finite learning rate or bound would only show up much
    later, as non-finite losses. Its ints and bools are strict (see `_strict_counts_and_switches`);
    its floats stay lax, so `lr: 1` is 1.0 and `--set algo.actor_lr=1e-3` (a string to YAML 1.1) is
    0.001, but they refuse true and false."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler) -> CoreSchema:
        return _strict_counts_and_switches(handler(source))
