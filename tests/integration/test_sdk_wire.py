"""What the SDK puts on the wire: a request holds the fields its caller set and no defaults,
so a worker one release older, which does not know a newer optional field, still takes it
(docs/operations.md: an upgrade rolls the workers first, but clients need not wait)."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest

from memstream.producers.client import MemoryClient
from memstream.schemas.commands import VERBS, ListRequest
from memstream.schemas.recall import RecallRequest
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def test_requests_carry_what_the_caller_set_and_no_defaults(
    nats_url: str, namespace: str
) -> None:
    """A recall and a list command, answered by a bare responder on a real NATS server: the
    bodies hold the caller's fields only (no ``own``, ``scopes`` or ``schema_version``), and
    each still parses to the request the caller meant."""
    subjects = Subjects(namespace)
    seen: dict[str, dict[str, Any]] = {}
    nc = await nats.connect(nats_url)

    async def answer(msg: Any) -> None:
        seen[msg.subject] = json.loads(msg.data)
        reply: dict[str, Any] = {"ok": True}
        if msg.subject == subjects.recall:
            reply = {"ok": True, "hits": [], "method": "hybrid"}
        await msg.respond(json.dumps(reply).encode())

    await nc.subscribe(subjects.recall, cb=answer)
    await nc.subscribe(subjects.cmd("list"), cb=answer)
    await nc.flush()
    client = MemoryClient("t1", user="u1", nats_url=nats_url, namespace=namespace)
    try:
        await client.recall("where do I live", top_k=3)
        await client.command("list", limit=5)
    finally:
        await client.close()
        await nc.close()
    recall = seen[subjects.recall]
    assert set(recall) == {"tenant", "user", "query", "top_k"}, recall
    assert RecallRequest.model_validate(recall).top_k == 3
    listed = seen[subjects.cmd("list")]
    assert set(listed) == {"tenant", "user", "limit"}, listed
    assert VERBS["list"] is ListRequest and ListRequest.model_validate(listed).limit == 5
