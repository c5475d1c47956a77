"""Helpers for the console tests: the operator token, where the screenshots land, a logged-in
page, a screenshot, and the memory events on a test's events stream."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
from playwright.async_api import BrowserContext, Page, expect

from memstream.schemas.subjects import Subjects

TOKEN = "operator-token-for-tests"
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


async def logged_in(context: BrowserContext, url: str) -> Page:
    page = await context.new_page()
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))  # confirmations
    await page.goto(url)
    await page.fill("input[name=token]", TOKEN)
    await page.click("button[type=submit]")
    await expect(page.locator("h1")).to_have_text("Overview")
    return page


async def shot(page: Page, name: str) -> None:
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def events_of(running: Any, kind: str) -> list[dict[str, Any]]:
    """Memory events of one kind on the test's events stream (oldest first)."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(s.events(), stream=s.stream("events"), ordered_consumer=True)
        out = []
        try:
            while True:
                msg = await sub.next_msg(timeout=0.5)
                event = json.loads(msg.data)
                if event["kind"] == kind:
                    out.append(event)
        except nats.errors.TimeoutError:
            pass
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
