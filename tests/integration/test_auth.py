"""Tenant credentials on recall and commands."""

from __future__ import annotations

import pytest

from memstream.producers.client import CommandError, RecallError

pytestmark = pytest.mark.integration


async def test_keys_bind_requests_to_their_tenant(running) -> None:
    """With keys required: no key, a wrong key or another tenant's key is refused with
    'unauthorized' (the key never echoed); the tenant's own key works; a revoked key stops."""
    running.worker.auth.required = True
    acme = await running.pg.create_api_key("acme")
    other = await running.pg.create_api_key("other")
    async with running.client("acme", user="kim") as anonymous:
        with pytest.raises(RecallError) as err:
            await anonymous.recall("anything")
        assert err.value.code.value == "unauthorized"
        with pytest.raises(CommandError) as cerr:
            await anonymous.remember("a secret plan")
        assert cerr.value.code.value == "unauthorized"
    for key in (other, "msk_not-a-key"):
        async with running.client("acme", user="kim", api_key=key) as intruder:
            with pytest.raises(RecallError) as err:
                await intruder.recall("anything")
            assert err.value.code.value == "unauthorized" and key not in str(err.value)
    async with running.client("acme", user="kim", api_key=acme) as kim:
        m = await kim.remember("the boat is moored at pier 9")
        assert (await kim.recall("where is the boat?")).hits[0].id == m.id
    assert await running.pg.revoke_api_key(acme)
    running.worker.auth._known.clear()  # the one-minute cache of checked keys
    async with running.client("acme", user="kim", api_key=acme) as kim:
        with pytest.raises(RecallError):
            await kim.recall("where is the boat?")
    rows = await running.pg._fetch("SELECT key_hash FROM api_keys")
    assert all(r["key_hash"] not in (acme, other) and len(r["key_hash"]) == 64 for r in rows)
