"""The roles of a worker process (`memstream worker --stages`): parsing, and the choices that
are refused before anything starts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from memstream.consumers import roles
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import ROLES, Settings


def joined(stages: tuple[str, ...], qdrant_url: str | None = None) -> Settings:
    """Settings of a process that joins a running stack (NATS and Postgres configured)."""
    return Settings.model_validate(
        {
            "stages": stages,
            "nats_url": "nats://127.0.0.1:4222",
            "database_url": "postgresql://x@h/db",
            "qdrant_url": qdrant_url,
        }
    )


def test_parse_returns_roles_in_pipeline_order_once() -> None:
    """--stages takes any order, spaces, repeats and case, and gives the roles in pipeline order."""
    assert roles.parse(" Redact,extract,redact ") == ("extract", "redact")
    assert roles.parse("recall,store,dedupe") == ("dedupe", "store", "recall")


@pytest.mark.parametrize("text", ["", ",", "extract,bogus", "index"])
def test_parse_refuses_empty_and_unknown_roles(text: str) -> None:
    """An empty list or an unknown role is refused with the roles there are."""
    with pytest.raises(ConfigurationError, match="extract,redact,dedupe,store,recall"):
        roles.parse(text)


def test_settings_read_stages_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMSTREAM_STAGES takes `extract,redact` or a JSON list; unset means every role."""
    assert Settings().stages == ROLES
    monkeypatch.setenv("MEMSTREAM_STAGES", "redact,extract")
    assert Settings().stages == ("extract", "redact")
    monkeypatch.setenv("MEMSTREAM_STAGES", '["store", "dedupe", "recall"]')
    assert Settings().stages == ("dedupe", "store", "recall")
    monkeypatch.setenv("MEMSTREAM_STAGES", "extract,nope")
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.setenv("MEMSTREAM_STAGES", " ")
    with pytest.raises(ValidationError, match="names no role"):
        Settings()


def test_every_role_needs_no_configured_servers() -> None:
    """The default (every role) may start the embedded stack: nothing to refuse."""
    roles.check(Settings())


def test_a_subset_must_join_a_running_stack() -> None:
    """A subset without NATS and Postgres URLs would start a stack of its own: refused."""
    with pytest.raises(ConfigurationError, match="MEMSTREAM_NATS_URL and MEMSTREAM_DATABASE_URL"):
        roles.check(Settings.model_validate({"stages": ("extract", "redact")}))


@pytest.mark.parametrize(
    "stages", [("extract", "redact"), ("dedupe", "store", "recall"), ("redact", *roles.INDEX_ROLES)]
)
def test_edge_allows_extra_processes_and_the_shard_owner(stages: tuple[str, ...]) -> None:
    """With Qdrant Edge, extract/redact alone or all three shard roles together are allowed."""
    roles.check(joined(stages))


@pytest.mark.parametrize(
    ("stages", "missing"),
    [
        (("dedupe",), "store,recall"),
        (("extract", "store"), "dedupe,recall"),
        (("recall",), "dedupe,store"),
    ],
)
def test_edge_refuses_a_split_of_the_shard_roles(stages: tuple[str, ...], missing: str) -> None:
    """With Qdrant Edge, a process with some of dedupe/store/recall but not all is refused,
    naming what it leaves out and the two ways out."""
    with pytest.raises(ConfigurationError) as caught:
        roles.check(joined(stages))
    said = str(caught.value)
    assert f"leave out {missing}" in said
    assert "--stages extract,redact" in said and "MEMSTREAM_QDRANT_URL" in said


def test_a_qdrant_server_lets_any_role_run_anywhere() -> None:
    """With a Qdrant server, a process may take any one role, store or recall alone included."""
    for role in ROLES:
        roles.check(joined((role,), "http://qdrant:6333"))


def test_holds_index_only_for_roles_that_use_it() -> None:
    """Only dedupe, store and recall open the vector index."""
    assert not roles.holds_index(("extract", "redact"))
    assert all(roles.holds_index((r,)) for r in ("dedupe", "store", "recall"))
