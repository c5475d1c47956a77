"""Agent CLI verbs: ``memstream publish`` and ``memstream recall``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from memstream.producers.client import MemoryClient, MemoryClientError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default="default")
    p.add_argument("--user", default=None)
    p.add_argument("--agent", default=None)
    p.add_argument("--session", default=None)
    p.add_argument(
        "--nats-url", default=None, help="default: MEMSTREAM_NATS_URL or memstream dev's"
    )
    p.add_argument(
        "--nats-creds",
        default=None,
        help="a NATS .creds file (default: MEMSTREAM_NATS_CREDS); see docs/security.md",
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON reply")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pub = sub.add_parser("publish", help="publish one conversation turn")
    _common(pub)
    pub.add_argument("text", help="the message content")
    pub.add_argument("--role", default="user", choices=["user", "assistant"])
    pub.add_argument("--event-id", default=None)
    pub.set_defaults(func=lambda a: asyncio.run(_publish(a)))

    rec = sub.add_parser("recall", help="recall memories for a query")
    _common(rec)
    rec.add_argument("query")
    rec.add_argument("--top-k", type=int, default=5)
    rec.add_argument("--method", default="hybrid", choices=["hybrid", "keyword", "vector"])
    rec.set_defaults(func=lambda a: asyncio.run(_recall(a)))
    _register_management(sub)


# verb -> (help, positional arguments, options): each maps onto one mem.cmd.<verb> request.
MANAGEMENT: dict[str, tuple[str, list[str], list[str]]] = {
    "remember": ("store a memory explicitly", ["content"], ["type", "scope", "pinned"]),
    "get": ("show one memory", ["id"], []),
    "list": ("list memories (newest first)", [], ["limit", "offset", "type"]),
    "pin": ("pin a memory (ranks first, never expires)", ["id"], []),
    "unpin": ("unpin a memory", ["id"], []),
    "forget": ("forget one memory (tombstone)", ["id"], []),
    "forget_owner": ("erase the owner's memories, vectors and raw turns", [], []),
    "fact_put": ("set a fact (closes the current version)", ["key", "value"], []),
    "fact_update": ("update an existing fact", ["key", "value"], []),
    "fact_history": ("every version of a fact", ["key"], []),
    "memory_off": ("stop storing memories of a session", [], []),
    "memory_on": ("store memories of a session again", [], []),
}


def _register_management(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb, (help_text, positionals, options) in MANAGEMENT.items():
        p = sub.add_parser(verb.replace("_", "-"), help=help_text)
        _common(p)
        for name in positionals:
            p.add_argument(name)
        if "type" in options:
            p.add_argument("--type", default=None)
        if "scope" in options:
            p.add_argument("--scope", default=None)
        if "pinned" in options:
            p.add_argument("--pinned", action="store_true")
        if "limit" in options:
            p.add_argument("--limit", type=int, default=20)
            p.add_argument("--offset", type=int, default=0)
        p.set_defaults(
            func=lambda a, verb=verb, pos=positionals: asyncio.run(_manage(a, verb, pos))
        )


async def _manage(a: argparse.Namespace, verb: str, positionals: list[str]) -> int:
    fields: dict[str, object] = {name: getattr(a, name) for name in positionals}
    if verb in ("forget_owner", "memory_off", "memory_on", "list") and a.session:
        fields["session"] = a.session
    elif verb in ("memory_off", "memory_on"):
        print("memstream: --session is required", file=sys.stderr)
        return 2
    if getattr(a, "type", None):
        fields["types" if verb == "list" else "type"] = [a.type] if verb == "list" else a.type
    if getattr(a, "scope", None):
        fields["scope"] = a.scope
    if getattr(a, "pinned", False):
        fields["pinned"] = True
    if verb == "list":
        fields.update(limit=a.limit, offset=a.offset)
    try:
        async with _client(a) as mem:
            reply = await mem.command(verb, **fields)
    except MemoryClientError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(reply.model_dump_json(indent=2))
        return 0
    records = ([reply.memory] if reply.memory else []) + list(reply.memories)
    for m in records:
        state = " (pinned)" if m.pinned else ""
        print(f"{m.id}  {m.type.value:<10} {m.scope.value:<8}{state} {m.content[:160]}")
    if reply.counts:
        print(", ".join(f"{k}: {v}" for k, v in reply.counts.items()))
    if not records and not reply.counts:
        print("ok")
    return 0


def _client(a: argparse.Namespace) -> MemoryClient:
    user = a.user if (a.user or a.agent) else "default"
    return MemoryClient(
        a.tenant, user=user, agent=a.agent, nats_url=a.nats_url, nats_creds=a.nats_creds
    )


async def _publish(a: argparse.Namespace) -> int:
    try:
        async with _client(a) as mem:
            res = await mem.publish_turn(
                [(a.role, a.text)], session=a.session or "default", event_id=a.event_id or None
            )
    except MemoryClientError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 1
    assert res is not None
    dup = " (duplicate: already stored)" if res.duplicate else ""
    print(f"published event {res.event_id} to {res.stream} seq {res.seq}{dup}")
    return 0


async def _recall(a: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        async with _client(a) as mem:
            reply = await mem.recall(a.query, top_k=a.top_k, session=a.session, method=a.method)
    except MemoryClientError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(reply.model_dump_json(indent=2))
        return 0
    took = (time.perf_counter() - started) * 1000
    print(
        f"{len(reply.hits)} hit(s) in {took:.1f} ms "
        f"(server {reply.timings_ms.get('total', 0):.1f} ms)"
        + (f", degraded: {', '.join(reply.degraded)}" if reply.degraded else "")
    )
    for i, h in enumerate(reply.hits, 1):
        text = h.text.replace("\n", " / ")
        print(f"{i:>2}. [{h.score:.3f}] ({h.type.value}, session {h.session}) {text[:200]}")
    return 0
