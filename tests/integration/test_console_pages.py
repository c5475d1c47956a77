"""The web console's pages in a real browser (Playwright driving Debian's Chromium) against a
running worker on real NATS, Postgres and Qdrant Edge: the live overview, dead letters (shown
redacted, discarded, replayed), and the memories, recall playground and events pages.
Screenshots land in build/screenshots/."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import nats
import pytest
from consoles import events_of, logged_in, shot
from playwright.async_api import expect

from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_overview_counts_move_as_turns_are_processed(
    running: Any, console: str, context: Any
) -> None:
    """Publishing turns moves the overview's per-stage counts, stream sizes and redaction
    counts live (no reload), and the health table shows every dependency up."""
    page = await logged_in(context, console)
    acked = page.locator("#stages tr[data-stage=store] td[data-col=fused]")
    turns = page.locator("#streams tr[data-stream=turns] td[data-col=messages]")
    await expect(acked).to_have_text("0")
    await expect(turns).to_have_text("0")
    await shot(page, "overview-idle")
    async with running.client("acme", user="ops") as mem:
        for text in (
            "I prefer green tea",
            "Mail me at ops@example.org",
            "Deploys happen on Friday",
        ):
            await mem.publish_turn([("user", text)], session="s1")
        await running.wait_for(running.drained, 20, "ingestion")
        await mem.recall("tea")
    store = running.worker.deps.metrics["store"]
    stored = store.fused  # a worker running every stage hands store its candidates in memory
    assert stored >= 3 and store.acked == 0
    await expect(turns).to_have_text("3", timeout=10_000)  # the page polls every 2 s
    await expect(acked).to_have_text(str(stored))
    extract = page.locator("#stages tr[data-stage=extract] td[data-col=processed]")
    await expect(extract).to_have_text("3")
    await expect(page.locator("#counts")).to_contain_text(f"{stored} / {stored}")
    await expect(page.locator("#recall-rate + .sub")).to_contain_text("1 ok")
    await expect(page.locator("#redactions")).to_contain_text("EMAIL 1")
    health = page.locator("#health .pill")
    await expect(health).to_have_count(4)  # the console's NATS, the worker's NATS, Postgres, index
    await expect(page.locator("#health .pill.down")).to_have_count(0)
    await shot(page, "overview-after-turns")


async def test_dead_letter_is_shown_redacted_and_discarded(
    running: Any, console: str, context: Any
) -> None:
    """A turn that cannot be decoded is listed with its reason; its body is shown redacted
    (the phone number and email never reach the page); discarding asks first, removes it and
    leaves an audit event."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    body = {
        "tenant": "acme",
        "user": "bob",
        "messages": [],
        "note": "bob@example.com +1 415 555 0100",
    }
    await nc.jetstream().publish(s.turns("acme", "bob", "s1"), json.dumps(body).encode())
    await nc.close()
    page = await logged_in(context, console)
    await expect(page.locator("#dlq-total")).to_have_text("1", timeout=10_000)
    await page.click("#dlq-total a")
    row = page.locator("#letters tbody tr")
    await expect(row).to_have_count(1)
    await expect(row.locator(".reason")).to_contain_text("invalid TurnEvent")
    await expect(row).to_contain_text(s.turns("acme", "bob", "s1"))
    await shot(page, "dlq-list")
    await row.get_by_text("Inspect").click()
    await expect(page.locator("#body")).to_contain_text("[EMAIL:")
    await expect(page.locator("#body")).to_contain_text("[PHONE:")
    html = await page.content()
    assert "bob@example.com" not in html and "555 0100" not in html
    await shot(page, "dlq-inspect")
    await page.get_by_role("button", name="Discard").click()  # the dialog is accepted
    await expect(page.locator(".flash.good")).to_contain_text("was discarded")
    await expect(page.locator(".empty")).to_contain_text("No dead letters")
    audit = await events_of(running, "console.dlq.discard")
    assert [(e["tenant"], e["detail"]["stage"]) for e in audit] == [("acme", "extract")]


async def test_dead_letter_replayed_after_a_fault_is_stored(
    running: Any, console: str, context: Any, database_url: str
) -> None:
    """A turn dead-lettered while Postgres lacks its memories table (a real fault) is listed
    with the delivery count and reason; once the table is back, Replay sends it through and
    the memory is stored; the replay is audited."""
    schema = running.settings.namespace
    con = await asyncpg.connect(database_url)
    await con.execute(f'ALTER TABLE "{schema}".memories RENAME TO memories_away')
    try:
        async with running.client("acme", user="carol") as mem:
            await mem.publish_turn([("user", "I am allergic to shellfish")], session="s1")
        await running.wait_for(running.drained, 20, "the retries to give up")
    finally:
        await con.execute(f'ALTER TABLE "{schema}".memories_away RENAME TO memories')
        await con.close()
    assert await running.pg.count("acme") == 0
    page = await logged_in(context, console)
    await page.goto(console + "dlq")
    rows = page.locator("#letters tbody tr")
    await expect(rows).not_to_have_count(0)
    first = rows.first
    await expect(first.locator(".reason")).to_contain_text(re.compile(r"\w"))
    deliveries = await first.locator("td").nth(5).inner_text()
    assert int(deliveries) >= 1
    await shot(page, "dlq-after-fault")
    while await rows.count():
        await rows.first.get_by_role("button", name="Replay").click()
        await expect(page.locator(".flash.good")).to_contain_text("was replayed")
    await running.wait_for(running.drained, 20, "the replayed message")
    await eventually(lambda: _stored(running), "the replayed memory")
    await page.goto(console + "memories?tenant=acme&user=carol")
    await page.click("text=Show memories")
    await expect(page.locator("#memories")).to_contain_text("allergic to shellfish")
    await shot(page, "dlq-replayed-memory-stored")
    assert len(await events_of(running, "console.dlq.replay")) >= 1


async def _stored(running: Any) -> bool:
    return bool(await running.pg.count("acme"))


async def test_replay_goes_only_back_into_the_pipeline(
    running: Any, console: str, context: Any
) -> None:
    """A dead letter whose subject header names something outside the pipeline's streams (a
    command) is not replayed: the page says why and the dead letter stays."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    headers = {
        "Memstream-Dlq-Reason": "forged",
        "Memstream-Dlq-Stage": "store",
        "Memstream-Dlq-Subject": s.cmd("forget_owner"),
    }
    body = json.dumps({"tenant": "acme", "user": "dave"}).encode()
    await nc.jetstream().publish(s.dlq("store"), body, headers=headers)
    await nc.close()
    page = await logged_in(context, console)
    await page.goto(console + "dlq?stage=store")
    await page.get_by_role("button", name="Replay").click()
    await expect(page.locator("#dlq-error")).to_contain_text("no pipeline subject")
    await page.reload()
    await expect(page.locator("#letters tbody tr")).to_have_count(1)
    assert await events_of(running, "console.dlq.replay") == []


async def test_recall_playground_then_forget_and_pin(
    running: Any, console: str, context: Any
) -> None:
    """The playground recalls a stored memory with its score, timings per leg and degraded
    state; pinning shows it pinned; forgetting (confirmed) makes recall stop returning it;
    the events page lists ids and kinds, never the content, and filters by tenant."""
    async with running.client("acme", user="alice") as mem:
        await mem.publish_turn([("user", "I'm allergic to peanuts")], session="s1")
        await mem.publish_turn([("user", "I prefer green tea over coffee")], session="s1")
        await running.wait_for(running.drained, 20, "ingestion")
    page = await logged_in(context, console)
    await page.click("text=Memories")
    await page.fill("#owner input[name=tenant]", "acme")
    await page.fill("#owner input[name=user]", "alice")
    await page.click("text=Show memories")
    await expect(page.locator("#memories")).to_contain_text("peanuts")
    await page.fill("#recall input[name=query]", "what am I allergic to?")
    await page.locator("#recall").get_by_role("button", name="Recall").click()
    hits = page.locator("#hits tbody tr")
    await expect(hits.first).to_contain_text("peanuts")
    await expect(page.locator("#recall-summary")).to_contain_text("degraded: none")
    await expect(page.locator("#recall-summary .leg")).not_to_have_count(0)
    await expect(page.locator("#recall-summary")).to_contain_text("total")
    await shot(page, "memories-recall")

    tea = page.locator("#memories tbody tr", has_text="green tea").first
    await tea.get_by_role("button", name="Pin").click()
    await expect(page.locator(".flash.good")).to_contain_text("Pinned")
    pinned = page.locator("#memories tbody tr", has_text="green tea").first
    await expect(pinned.get_by_role("button", name="Unpin")).to_be_visible()

    peanut_rows = page.locator("#memories tbody tr", has_text="peanuts")
    while await peanut_rows.count():
        await peanut_rows.first.get_by_role("button", name="Forget").click()
        await expect(page.locator(".flash.good")).to_contain_text("Forgot")
    await page.locator("#recall").get_by_role("button", name="Recall").click()
    await expect(page.locator("#recall-summary")).to_be_visible()
    await expect(page.locator("#recall-results")).not_to_contain_text("peanuts")
    await shot(page, "memories-forgotten")
    forgotten = await events_of(running, "console.memory.forget")
    assert forgotten and all(e["user"] == "alice" for e in forgotten)

    await page.click("text=Events")
    await expect(page.locator("#events")).to_contain_text("forgotten")
    await expect(page.locator("#events")).to_contain_text("console.memory.pin")
    assert "peanuts" not in await page.content()
    await shot(page, "events")
    await page.fill("input[name=tenant]", "someone-else")
    await page.click("text=Filter")
    await expect(page.locator("#events tbody")).to_contain_text("No events yet.")
    await page.fill("input[name=tenant]", "acme")
    await page.click("text=Filter")
    await expect(page.locator("#events tbody tr").first).to_contain_text("acme")
    await expect(page.locator("#events tbody")).not_to_contain_text("_console")
