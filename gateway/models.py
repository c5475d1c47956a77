"""The base of every request body: unknown fields are refused, values never appear in
validation errors, and no string may hold a NUL character (Postgres text cannot store one:
such input is a 422 here, not a failure further down)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def has_nul(value: Any, depth: int = 0) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if depth > 64:
        return False  # pydantic's own nesting limits apply beyond this
    if isinstance(value, dict):
        return any(has_nul(k, depth + 1) or has_nul(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v, depth + 1) for v in value)
    return False


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        if has_nul(data):
            raise ValueError("text must not contain NUL characters")
        return data
