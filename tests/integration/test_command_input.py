"""Commands refuse input the store cannot hold with a clear code, not an internal error."""

from __future__ import annotations

import pytest

from memstream.producers.client import CommandError

pytestmark = pytest.mark.integration


async def test_ids_that_are_no_uuid_are_not_found(running) -> None:
    """get, pin, forget of an id that is no UUID: not_found (was internal: a driver error)."""
    async with running.client("acme", user="u") as mem:
        for call in (mem.get, mem.pin, mem.forget):
            with pytest.raises(CommandError) as info:
                await call("not-a-uuid\u00c4")
            assert info.value.code.value == "not_found"


async def test_nul_characters_are_dropped_from_text_and_refused_in_ids(running) -> None:
    """Postgres text cannot store NUL: free text (content, metadata values) loses it and is
    stored; an identifier with one (a session filter) is bad_request (docs/memory-model.md)."""
    async with running.client("acme", user="u") as mem:
        assert (await mem.command("remember", content="a\x00b")).memory.content == "ab"
        stored = await mem.command("remember", content="ok then", metadata={"k": "v\x00"})
        assert stored.memory.metadata == {"k": "v"}
        with pytest.raises(CommandError) as info:
            await mem.list_memories(session="s\x00")
        assert info.value.code.value == "bad_request"
        assert (await mem.remember("no nul here")).content == "no nul here"
