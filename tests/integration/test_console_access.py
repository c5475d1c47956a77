"""Who gets into the web console and where, in a real browser (Playwright driving Debian's
Chromium) against a running worker on real NATS, Postgres and Qdrant Edge: the operator token,
its session cookie and CSRF token, login throttling, and the app mounted under another prefix.
Screenshots land in build/screenshots/."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

import nats
import pytest
from consoles import TOKEN, events_of, logged_in, shot
from playwright.async_api import expect

from memstream.console import ConsoleBackend, serve
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def test_the_operator_token_is_required(running: Any, console: str, context: Any) -> None:
    """Without the token every page redirects to the login form, a wrong token is refused and
    audited, a POST without the CSRF token is refused, a session cookie expires, and no page
    shows the token."""
    page = await context.new_page()
    for path in ("", "dlq", "memories", "events"):
        await page.goto(console + path)
        await expect(page.locator("h1")).to_have_text("Operator login")
    refused = await context.request.post(console + "dlq/1/discard")
    assert refused.status == 401
    wrong = await context.request.get(console, headers={"Authorization": "Bearer nope"})
    assert "Operator login" in await wrong.text()  # redirected to the form
    await page.fill("input[name=token]", "not-the-token")
    await page.click("button[type=submit]")
    await expect(page.get_by_role("alert")).to_have_text("That is not the operator token.")
    await shot(page, "login-refused")
    page = await logged_in(context, console)
    cookie = next(c for c in await context.cookies() if c["name"] == "memstream_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != TOKEN
    assert TOKEN not in await page.content()
    forged = await context.request.post(console + "dlq/1/discard")  # cookie, but no CSRF token
    assert forged.status == 403
    stale = f"{int(time.time()) - 13 * 3600}"  # signed with the token, but past 12 hours
    signed = hmac.new(TOKEN.encode(), f"memstream-console-session:{stale}".encode(), "sha256")
    await context.clear_cookies()
    await context.add_cookies(
        [{"name": "memstream_console", "value": f"{stale}.{signed.hexdigest()}", "url": console}]
    )
    await page.goto(console)
    await expect(page.locator("h1")).to_have_text("Operator login")
    bearer = await context.request.get(
        console + "overview/panel", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bearer.status == 200 and "Stages" in await bearer.text()
    assert len(await events_of(running, "console.login.failed")) == 1
    assert len(await events_of(running, "console.login")) == 1


async def test_guessing_the_token_is_throttled(running: Any, console: str, context: Any) -> None:
    """After ten wrong tokens in a minute the login form refuses to check more (429), each
    wrong one audited; an oversized form is refused before it is read whole."""
    for _ in range(10):
        wrong = await context.request.post(console + "login", form={"token": "guess-guess-guess"})
        assert wrong.status == 401
    throttled = await context.request.post(console + "login", form={"token": TOKEN})
    assert throttled.status == 429 and "Too many failed logins" in await throttled.text()
    assert len(await events_of(running, "console.login.failed")) == 10
    big = await context.request.post(
        console + "memories/recall",
        headers={"Authorization": f"Bearer {TOKEN}"},
        form={"query": "x" * 100_000, "tenant": "acme", "user": "u"},
    )
    assert big.status == 413


async def test_mounted_under_another_prefix(running: Any, context: Any) -> None:
    """The same app mounted elsewhere keeps every link, asset and action under its prefix:
    login, live panel and static files work at /gw/console/; with a redactor of its own (as
    in the worker's process) it redacts dead letters itself."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from memstream.console import create_app

    backend = await ConsoleBackend.connect(
        running.settings, running.nats_url, running.worker.redactor
    )
    app = Starlette(routes=[Mount("/gw/console", create_app(backend, TOKEN))])
    server = await serve(app, "127.0.0.1", 0)
    root = f"http://127.0.0.1:{server.port}/gw/console/"
    try:
        page = await logged_in(context, root)
        assert page.url == root
        css = await context.request.get(root + "static/console.css")
        assert css.status == 200 and "memstream console" in await css.text()
        await expect(page.locator("#workers")).to_have_text("1")
        await page.click("text=Dead letters")
        assert page.url == root + "dlq"
        await expect(page.locator(".empty")).to_contain_text("No dead letters")
        s = Subjects(running.settings.namespace)
        nc = await nats.connect(running.nats_url)
        bad = {"tenant": "acme", "messages": [], "note": "write to eve@example.com"}
        await nc.jetstream().publish(s.turns("acme", "eve", "s1"), json.dumps(bad).encode())
        await nc.close()
        await running.wait_for(running.drained, 20, "the dead letter")
        await page.reload()
        await page.get_by_text("Inspect").click()
        await expect(page.locator("#body")).to_contain_text("[EMAIL:")
        assert "eve@example.com" not in await page.content()
    finally:
        await server.stop()
        await backend.close()
