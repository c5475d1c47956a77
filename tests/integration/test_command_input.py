"""Commands refuse input the store cannot hold with a clear code, not an internal error."""

from __future__ import annotations

import pytest

from memstream.producers.client import CommandError

pytestmark = pytest.mark.integration


async def test_ids_that_are_no_uuid_are_not_found(running) -> None:  # type: ignore[no-untyped-def]
    """get, pin, forget of an id that is no UUID: not_found (was internal: a driver error)."""
    async with running.client("acme", user="u") as mem:
        for call in (mem.get, mem.pin, mem.forget):
            with pytest.raises(CommandError) as info:
                await call("not-a-uuid\u00c4")
            assert info.value.code.value == "not_found"


async def test_nul_characters_are_a_bad_request(running) -> None:  # type: ignore[no-untyped-def]
    """Text with a NUL character (Postgres text cannot store it) is bad_request, in content,
    metadata or a filter alike."""
    async with running.client("acme", user="u") as mem:
        for fields in (
            {"content": "a\x00b"},
            {"content": "ok", "metadata": {"k": "v\x00"}},
        ):
            with pytest.raises(CommandError) as info:
                await mem.command("remember", **fields)
            assert info.value.code.value == "bad_request"
        with pytest.raises(CommandError) as info:
            await mem.list_memories(session="s\x00")
        assert info.value.code.value == "bad_request"
        assert (await mem.remember("no nul here")).content == "no nul here"
