"""The base of every request body: unknown fields are refused, values never appear in
validation errors, and no string may hold a NUL character (Postgres text cannot store one:
such input is a 422 here, not a failure further down)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from memstream.schemas.events import Ident

# Identifiers follow the wire schema's rule (no control characters, 1..200): a value the
# gateway accepts must also build the turn or command it is sent as.
Id = Ident
ChatSession = Annotated[
    str, StringConstraints(min_length=6, max_length=200, pattern=r"^chat:[^\x00-\x1f\x7f-\x9f]+$")
]


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
