"""The web console in a real browser (Playwright driving Debian's Chromium) against a running
worker on real NATS, Postgres and Qdrant Edge. Screenshots land in build/screenshots/."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from memstream.console import ConsoleBackend, serve, standalone
from memstream.console.backend import HIDDEN
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration

TOKEN = "operator-token-for-tests"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
MEMSTREAM = str(Path(sys.executable).parent / "memstream")


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():  # .ci/run installs it; a developer's machine may not have it
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (as .ci/run does)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    return CHROMIUM


@pytest.fixture(scope="session")
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


@pytest.fixture
async def console(running: Any) -> AsyncIterator[str]:
    """The console app served over HTTP on a free loopback port, as a NATS client of the
    worker (dead letters redacted by the worker, as in the gateway); yields its URL."""
    backend = await ConsoleBackend.connect(running.settings, running.nats_url)
    server = await serve(standalone(backend, TOKEN), "127.0.0.1", 0)
    yield server.url
    await server.stop()
    await backend.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(15_000)
    yield ctx
    await ctx.close()


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


async def eventually(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


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


def test_dev_prints_and_records_the_console_url(tmp_path: Path) -> None:
    """`memstream dev` serves the console, prints its URL and records it as console_url in
    stack.json; the token it made is in a file only its owner reads, and the console asks
    for it."""
    state = tmp_path / "state"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(state),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_CONSOLE_PORT": "0",
    }
    log = (tmp_path / "dev.log").open("w")
    proc = subprocess.Popen(
        [MEMSTREAM, "dev"], env=env, stdout=subprocess.PIPE, stderr=log, text=True
    )
    log.close()
    assert proc.stdout is not None
    said: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not said or "Ctrl-C stops everything." not in said[-1]:
            why = f"dev did not start: {said} {(tmp_path / 'dev.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline and proc.poll() is None, why
            said.append(proc.stdout.readline())
        line = next(ln for ln in said if ln.strip().startswith("console"))
        url = re.search(r"http://\S+/console/", line)
        assert url is not None, line
        recorded = json.loads((state / "stack.json").read_text())
        assert recorded["console_url"] == url.group(0)
        token_file = state / "console-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.read_text().strip() not in "".join(said)
        with urllib.request.urlopen(url.group(0), timeout=10) as resp:
            assert "Operator login" in resp.read().decode()  # redirected: no token, no console
        req = urllib.request.Request(
            url.group(0) + "overview/panel",
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert "Workers answering" in resp.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0


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


async def test_without_a_worker_dead_letters_stay_hidden(
    running: Any, nats_url: str, namespace: str
) -> None:
    """A console without a redactor of its own asks the workers to redact; the worker's answer
    is redacted with its key, and when no worker answers the text is hidden, never shown (and
    the overview says no worker answered)."""
    backend = await ConsoleBackend.connect(running.settings, running.nats_url)
    try:
        ((text, counts),) = await backend.redact([("acme", "mail bob@example.com")])
        assert "bob@example.com" not in text and "[EMAIL:" in text and counts == {"EMAIL": 1}
        local = running.worker.redactor.redact("mail bob@example.com", "acme").text
        assert text == local  # the same key and policies: placeholders match stored memories'
    finally:
        await backend.close()
    alone = running.settings.model_copy(update={"namespace": f"{namespace}x"})
    backend = await ConsoleBackend.connect(alone, nats_url)  # a namespace no worker serves
    try:
        assert await backend.redact([("acme", "mail bob@example.com")]) == [(HIDDEN, {})]
        o = await backend.overview()  # nothing there: said so, not an error page
        assert o["workers"] == 0 and ("workers", False, "no worker answered") in o["health"]
        assert o["streams"]["turns"] is None and o["stages"]["store"]["consumer"] is None
    finally:
        await backend.close()


async def test_memstream_console_serves_alone(running: Any, tmp_path: Path) -> None:
    """`memstream console` serves the console as a NATS client of a worker running elsewhere:
    it needs only NATS and the token, sees that worker, and stops cleanly on SIGTERM; without
    a token it refuses to start."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_NATS_URL": running.nats_url,
        "MEMSTREAM_NAMESPACE": running.settings.namespace,
        "MEMSTREAM_STATE_DIR": str(tmp_path),
        "MEMSTREAM_CONSOLE_PORT": "0",
    }
    refused = await asyncio.create_subprocess_exec(
        MEMSTREAM, "console", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert await asyncio.wait_for(refused.wait(), 60) == 2
    proc = await asyncio.create_subprocess_exec(
        MEMSTREAM,
        "console",
        env={**env, "MEMSTREAM_CONSOLE_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = re.search(r"http://\S+/console/", line)
        assert url is not None, line

        def panel() -> str:
            req = urllib.request.Request(
                url.group(0) + "overview/panel", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                return str(resp.read().decode())

        html = await asyncio.to_thread(panel)
        assert re.search(r'id="workers">1<', html), "the worker is not seen"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0


async def test_console_requests_are_answered_on_inboxes_only(running: Any) -> None:
    """A stats or redaction request whose reply subject lies in the namespace (a stream's
    subject) gets no answer: the worker never writes its reply into a stream."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        forged = s.turns("acme", "mallory", "s1")
        await nc.publish(s.ops("stats"), b"", reply=forged)
        redact = json.dumps({"items": [{"tenant": "acme", "text": "x"}]}).encode()
        await nc.publish(s.ops("redact"), redact, reply=forged)
        # answered in order after the forged ones: once these come back, those were handled
        await nc.request(s.ops("stats"), b"", timeout=5)
        await nc.request(s.ops("redact"), redact, timeout=5)
        state = (await nc.jetstream().stream_info(s.stream("turns"))).state
        assert state.messages == 0
    finally:
        await nc.close()
