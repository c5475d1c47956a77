"""The console's pages: server-rendered HTML (Jinja2, autoescaped) with htmx for live panels and
actions. ``create_app(backend, token)`` returns an ASGI app to mount anywhere (the worker serves
it at ``/console`` on its console port, the gateway under its own ``/console``).

Access: the operator token, from the login form (then an HttpOnly, SameSite=Strict cookie that
holds its issue time and an HMAC of it under the token, never the token; valid for
``SESSION_S``) or ``Authorization: Bearer``. Every POST with the cookie must carry the CSRF
token (an HMAC of the operator token: only a logged-in page has it). Changing the token ends
every session.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from memstream.console.backend import Caller, ConsoleBackend
from memstream.console.errors import ConsoleError
from memstream.schemas.memory import Scope
from memstream.schemas.recall import Context, Method
from memstream.schemas.subjects import STAGES

HERE = Path(__file__).parent
COOKIE = "memstream_console"
NONE = "\u2013"  # an en dash: the value is unknown
SESSION_S = 12 * 3600
MIN_TOKEN = 16
MAX_FORM = 64 * 1024  # the largest form a console page sends is a recall query
MAX_FAILURES = 10  # failed logins per minute before the form refuses to check more
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
FLASH = {
    "replayed": "Dead letter {seq} was replayed to its subject.",
    "discarded": "Dead letter {seq} was discarded.",
}

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",  # pages hold memories and dead letters: never on disk
}

Handler = Callable[[Request], Awaitable[Response]]


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, size=_size, ms=_ms, when=_when, pct=_pct, rate=_rate)
    return env


def _num(v: Any) -> str:
    return NONE if v is None else f"{v:,.0f}" if isinstance(v, int | float) else str(v)


def _size(v: int | None) -> str:
    if v is None:
        return NONE
    size = float(v)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(v)


def _ms(v: float | None, unit: bool = True) -> str:
    if v is None:
        return NONE
    return (f"{v:.1f}" if v >= 10 else f"{v:.2f}") + (" ms" if unit else "")


def _pct(v: float | None) -> str:
    return NONE if v is None else f"{100 * v:.0f}%"


def _rate(v: float | None) -> str:
    return NONE if v is None else f"{v:,.1f}/s"


def _when(v: datetime | None) -> str:
    if v is None:
        return NONE
    return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def create_app(backend: ConsoleBackend, token: str) -> Starlette:
    """The console as an ASGI app; ``token`` is the operator token (required, non-empty)."""
    if len(token) < MIN_TOKEN:
        raise ValueError(f"the console needs an operator token of at least {MIN_TOKEN} characters")
    key = token.encode()

    def session(issued: int) -> str:
        sig = hmac.new(key, f"memstream-console-session:{issued}".encode(), hashlib.sha256)
        return f"{issued}.{sig.hexdigest()}"

    csrf = hmac.new(key, b"memstream-console-csrf", hashlib.sha256).hexdigest()[:32]
    env = _env()
    failures: deque[float] = deque()  # failed logins of the last minute (all clients)

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def page(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(base=base(request), csrf=csrf, stages=STAGES, **ctx)
        return HTMLResponse(html, status, headers=HEADERS)

    def bearer(request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        return auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].encode(), key)

    def cookie(request: Request) -> bool:
        value = request.cookies.get(COOKIE, "")
        issued = value.split(".", 1)[0]
        if not issued.isdigit() or not 0 <= time.time() - int(issued) < SESSION_S:
            return False
        return hmac.compare_digest(value.encode(), session(int(issued)).encode())

    async def form(request: Request) -> dict[str, str] | None:
        """A urlencoded body as a flat dict (last value wins; no multipart parser needed), or
        None when it is larger than any form of the console (read no further)."""
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                return None
        text = body.decode("utf-8", errors="replace")
        return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}

    def guarded(handler: Callable[..., Awaitable[Response]]) -> Handler:
        """Only an operator gets through; a cookie-borne POST must carry the CSRF token."""

        async def wrapped(request: Request) -> Response:
            if not (bearer(request) or cookie(request)):
                if request.headers.get("hx-request"):
                    return Response(
                        status_code=401, headers={"HX-Redirect": f"{base(request)}/login"}
                    )
                if request.method != "GET":
                    return Response("operator token required\n", 401)
                return RedirectResponse(f"{base(request)}/login", 303)
            data: dict[str, str] | None = {}
            if request.method == "POST":
                data = await form(request)
                if data is None:
                    return Response("request too large\n", 413)
                sent = request.headers.get("x-csrf-token") or data.get("csrf", "")
                if not bearer(request) and not hmac.compare_digest(sent.encode(), csrf.encode()):
                    return Response("missing or wrong CSRF token\n", 403)
            try:
                return await handler(request, data)
            except ConsoleError as exc:
                if request.headers.get("hx-request"):  # htmx swaps 2xx answers only
                    return page(request, "_error.html", 200, message=str(exc))
                return page(request, "error.html", 400, message=str(exc))

        return wrapped

    # --- login ------------------------------------------------------------------------------

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return page(request, "login.html")
        now = time.monotonic()
        while failures and now - failures[0] > 60:
            failures.popleft()
        if len(failures) >= MAX_FAILURES:  # guessing: refuse without even comparing
            return page(request, "login.html", 429, error="Too many failed logins: wait a minute.")
        data = await form(request)
        if data is None:
            return Response("request too large\n", 413)
        if not hmac.compare_digest(data.get("token", "").encode(), key):
            failures.append(now)
            await backend.audit("login.failed", None, client=_client(request))
            return page(request, "login.html", 401, error="That is not the operator token.")
        await backend.audit("login", None, client=_client(request))
        resp = RedirectResponse(f"{base(request)}/", 303)
        resp.set_cookie(
            COOKIE,
            session(int(time.time())),
            max_age=SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=f"{base(request)}/",
        )
        return resp

    async def logout(request: Request, data: dict[str, str]) -> Response:
        await backend.audit("logout", None, client=_client(request))
        resp = RedirectResponse(f"{base(request)}/login", 303)
        resp.delete_cookie(COOKIE, path=f"{base(request)}/")
        return resp

    # --- overview ----------------------------------------------------------------------------

    async def overview(request: Request, data: dict[str, str]) -> Response:
        return page(request, "overview.html", nav="overview", o=await backend.overview())

    async def overview_panel(request: Request, data: dict[str, str]) -> Response:
        return page(request, "_overview_panel.html", o=await backend.overview())

    # --- dead letters ------------------------------------------------------------------------

    async def dlq(request: Request, data: dict[str, str]) -> Response:
        stage = request.query_params.get("stage") or None
        if stage not in (None, *STAGES):
            stage = None
        jet = await backend.jetstream()
        flash = None
        if (done := request.query_params.get("done")) in FLASH:
            flash = FLASH[done].format(seq=_int(request.query_params.get("seq")))
        return page(
            request,
            "dlq.html",
            nav="dlq",
            stage=stage,
            counts=jet["dlq"],
            letters=await backend.dead_letters(stage),
            flash=flash,
        )

    async def dlq_one(request: Request, data: dict[str, str]) -> Response:
        letter, body, counts = await backend.dead_letter(_int(request.path_params["seq"]))
        await backend.audit("dlq.inspect", letter.tenant, seq=letter.seq, stage=letter.stage)
        return page(request, "dlq_one.html", nav="dlq", d=letter, body=body, counts=counts)

    def dlq_action(verb: str) -> Callable[[Request, dict[str, str]], Awaitable[Response]]:
        async def act(request: Request, data: dict[str, str]) -> Response:
            seq = _int(request.path_params["seq"])
            letter = await (backend.replay(seq) if verb == "replay" else backend.discard(seq))
            done = "replayed" if verb == "replay" else "discarded"
            where = f"{base(request)}/dlq?" + urlencode({"done": done, "seq": letter.seq})
            return Response(status_code=200, headers={"HX-Redirect": where})

        return act

    # --- memories ----------------------------------------------------------------------------

    async def memories(request: Request, data: dict[str, str]) -> Response:
        q = request.query_params
        owner = {k: q.get(k, "") for k in ("tenant", "user", "agent")}
        return page(
            request,
            "memories.html",
            nav="memories",
            owner=owner,
            methods=[m.value for m in Method],
            contexts=[c.value for c in Context],
            scopes=[s.value for s in Scope],
        )

    async def memory_list(
        request: Request, data: dict[str, str], flash: str | None = None
    ) -> Response:
        caller = _caller(data)
        offset = _int(data.get("offset", "0"))
        reply = await backend.command("list", caller, limit=50, offset=offset)
        if (
            flash is None
        ):  # an operator looked at an owner's memories (not a refresh after an action)
            await backend.audit("memory.list", caller.tenant, user=caller.user, agent=caller.agent)
        return page(
            request, "_memory_list.html", reply=reply, caller=caller, offset=offset, flash=flash
        )

    async def memory_action(request: Request, data: dict[str, str]) -> Response:
        verb = request.path_params["verb"]
        if verb not in ("forget", "pin", "unpin"):
            return Response("unknown action\n", 404)
        mid = data.get("id", "")
        await backend.command(verb, _caller(data), id=mid)
        flash = {"forget": "Forgot", "pin": "Pinned", "unpin": "Unpinned"}[verb] + f" {mid}."
        return await memory_list(request, data, flash)

    async def recall(request: Request, data: dict[str, str]) -> Response:
        caller = _caller(data)
        options: dict[str, Any] = {
            "method": data.get("method") or "hybrid",
            "top_k": _int(data.get("top_k") or "10"),
            "context": data.get("context") or "all",
            "score_threshold": float(data.get("score_threshold") or 0),
            "cache": data.get("cache") == "on",
        }
        if data.get("session"):
            options["session"] = data["session"]
        if data.get("scope"):
            options["scopes"] = [data["scope"]]
        reply = await backend.recall(caller, data.get("query", ""), **options)
        legs = [
            (name, reply.timings_ms[name])
            for name in ("embed", "dense", "keyword", "fetch", "search", "total")
            if name in reply.timings_ms
        ]
        return page(request, "_recall.html", reply=reply, legs=legs)

    # --- events ------------------------------------------------------------------------------

    async def events(request: Request, data: dict[str, str]) -> Response:
        tenant = request.query_params.get("tenant") or None
        rows = await backend.events(tenant=tenant)
        return page(request, "events.html", nav="events", events=rows, tenant=tenant or "")

    async def event_rows(request: Request, data: dict[str, str]) -> Response:
        tenant = request.query_params.get("tenant") or None
        return page(request, "_event_rows.html", events=await backend.events(tenant=tenant))

    async def root(request: Request) -> Response:
        return RedirectResponse(f"{request.url.path.rstrip('/')}/", 307)

    routes = [
        Route("/", guarded(overview)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", guarded(logout), methods=["POST"]),
        Route("/overview/panel", guarded(overview_panel)),
        Route("/dlq", guarded(dlq)),
        Route("/dlq/{seq:int}", guarded(dlq_one)),
        Route("/dlq/{seq:int}/replay", guarded(dlq_action("replay")), methods=["POST"]),
        Route("/dlq/{seq:int}/discard", guarded(dlq_action("discard")), methods=["POST"]),
        Route("/memories", guarded(memories)),
        Route("/memories/list", guarded(memory_list), methods=["POST"]),
        Route("/memories/recall", guarded(recall), methods=["POST"]),
        Route("/memories/{verb}", guarded(memory_action), methods=["POST"]),
        Route("/events", guarded(events)),
        Route("/events/rows", guarded(event_rows)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def standalone(backend: ConsoleBackend, token: str) -> Starlette:
    """The console at ``/console`` of its own server, ``/`` redirecting there."""

    async def home(request: Request) -> Response:
        return RedirectResponse("/console/", 307)

    return Starlette(routes=[Route("/", home), Mount("/console", create_app(backend, token))])


def _caller(data: dict[str, str]) -> Caller:
    tenant = data.get("tenant", "").strip()
    user = data.get("user", "").strip() or None
    agent = data.get("agent", "").strip() or None
    if not tenant or not (user or agent):
        raise ConsoleError("choose a tenant and a user or an agent")
    return Caller(tenant, user, agent, data.get("api_key") or None)


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ConsoleError(f"not a number: {str(v)[:20]!r}") from None


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"
