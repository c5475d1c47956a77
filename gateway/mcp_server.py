"""The MCP server: memstream's memory as tools an MCP client can call (docs/integrations.md).

Two transports, one set of tools (``mcp_tools.py``); this module holds the transports and how
each decides who the caller is:

- stdio, ``memstream mcp``: the identity is the process's configuration (``--tenant``,
  ``--user``, ``--agent``, ``--api-key`` or ``MEMSTREAM_MCP_TENANT``, ``MEMSTREAM_MCP_USER``,
  ``MEMSTREAM_MCP_AGENT``, ``MEMSTREAM_API_KEY``); a key, when given, is checked at start and
  decides the tenant and owner;
- Streamable HTTP at ``/mcp`` on the gateway (stateless, JSON responses): the identity is the
  ``Authorization: Bearer <key>`` of each request, resolved as every gateway route does; the
  key must be bound to a user or agent (a tenant-wide key names no owner, and no tool argument
  may name one).

Identity never comes from tool arguments: a model could change those.
"""

from __future__ import annotations

import logging

from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from memstream.gateway.errors import ApiError, error_response, unauthorized
from memstream.gateway.identity import KeyResolver
from memstream.gateway.mcp_tools import Resolve, build_server
from memstream.producers.client import MemoryClient

# --- Streamable HTTP on the gateway ---------------------------------------------------------


def _bearer(authorization: str | None) -> str:
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise unauthorized("send Authorization: Bearer <key>")
    return key.strip()


def http_resolver(resolver: KeyResolver, root: MemoryClient) -> Resolve:
    """Each tool call's owner: the request's Bearer key, as the gateway resolves keys."""

    async def resolve(ctx: Context) -> MemoryClient:
        headers = ctx.headers or {}
        ident = await resolver.resolve(_bearer(headers.get("authorization")))
        if ident.user is None and ident.agent is None:
            raise ApiError(
                403, "forbidden", "MCP needs a key bound to a user or agent (memstream keys create)"
            )
        return ident.client(root)

    return resolve


class BearerGate:
    """Refuses a request without a valid key before the MCP transport sees it (401/403 JSON in
    the gateway's error shape); the tools resolve the key again (cached) for their owner."""

    def __init__(self, inner: ASGIApp, resolver: KeyResolver) -> None:
        self.inner, self.resolver = inner, resolver

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                ident = await self.resolver.resolve(
                    _bearer(Headers(scope=scope).get("authorization"))
                )
                if ident.user is None and ident.agent is None:
                    raise ApiError(403, "forbidden", "MCP needs a key bound to a user or agent")
            except ApiError as exc:
                extra = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
                await error_response(exc.status, exc.code, exc.message, **extra)(
                    scope, receive, send
                )
                return
        await self.inner(scope, receive, send)


def http_app(
    resolver: KeyResolver, root: MemoryClient, flush_timeout_s: float
) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The ``/mcp`` endpoint and its session manager (run it in the app's lifespan).
    Stateless with JSON responses: any gateway copy answers any request. DNS-rebinding
    protection is off: every request must carry a key, and a browser page cannot add one."""
    # MCPServer configures the root logger when none is (logging.basicConfig): the gateway's
    # process keeps its own logging as it was
    root_handlers, root_level = logging.root.handlers[:], logging.root.level
    server = build_server(http_resolver(resolver, root), flush_timeout_s)
    logging.root.handlers[:], logging.root.level = root_handlers, root_level
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    return BearerGate(StreamableHTTPASGIApp(manager), resolver), manager


# --- stdio: `memstream mcp` -----------------------------------------------------------------


async def stdio_client(
    tenant: str | None,
    user: str | None,
    agent: str | None,
    api_key: str | None,
    nats_url: str,
    namespace: str,
) -> MemoryClient:
    """The configured owner. With a key, the key decides the tenant and owner (checked now:
    a wrong key fails at start, not at the first tool call); a configured user or agent
    must agree with the key's binding."""
    probe = MemoryClient("_mcp", user="_mcp", nats_url=nats_url, namespace=namespace)
    if api_key:
        try:
            found = await probe.whoami(api_key)
        finally:
            await probe.close()
        if tenant is not None and tenant != found["tenant"]:
            raise ValueError("the key belongs to another tenant than the one configured")
        for name, want, bound in (("user", user, found["user"]), ("agent", agent, found["agent"])):
            if want is not None and bound is not None and want != bound:
                raise ValueError(f"the key is bound to another {name} than the one configured")
        tenant = found["tenant"]
        user, agent = user or found["user"], agent or found["agent"]
    if not tenant or not (user or agent):
        raise ValueError("configure a tenant and a user or agent (or a key bound to one)")
    return MemoryClient(
        tenant,
        user=user,
        agent=agent,
        api_key=api_key,
        nats_url=nats_url,
        namespace=namespace,
        recall_timeout=10.0,
        command_timeout=10.0,
    )


async def serve_stdio(mem: MemoryClient, flush_timeout_s: float = 30.0) -> None:
    """Serve the tools on stdin/stdout for ``mem``'s owner until the client closes them."""

    async def resolve(_: Context) -> MemoryClient:
        return mem

    try:
        await build_server(resolve, flush_timeout_s).run_stdio_async()
    finally:
        await mem.close()
