"""Every worker answers ``<ns>.ops.stats`` (core NATS, no queue group) with a snapshot of its
counters and the health of its stores, so the console (in a worker, in the gateway, anywhere
with NATS) sums the whole deployment's workers instead of reading one process's memory.

The reply holds counts, latencies, ids of dependencies and their state; never a DSN, a key,
an exception message or a memory's content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import nats

from memstream.consumers.busauth import safe_reply
from memstream.consumers.logs import log
from memstream.consumers.roles import holds_index

PROBE_TIMEOUT_S = 1.0


async def _probe(what: Awaitable[int]) -> dict[str, Any]:
    """A count from a store, or why there is none (the exception's type only)."""
    try:
        return {"ok": True, "count": await asyncio.wait_for(what, PROBE_TIMEOUT_S)}
    except TimeoutError:
        return {"ok": False, "error": "no answer within 1 s"}
    except Exception as exc:  # noqa: BLE001 - a probe reports any failure as a state, never raises
        return {"ok": False, "error": type(exc).__name__}


async def snapshot(worker: Any) -> dict[str, Any]:
    """This worker's counters since it started, and its stores' health and sizes."""
    stages = {
        name: {
            **{k: v for k, v in asdict(m).items() if k not in ("redactions", "last_error")},
            "active_s": m.active_until_now(),
        }
        for name, m in worker.deps.metrics.items()
    }
    cache = worker.deps.cache
    health: dict[str, Any] = {
        "nats": {"ok": bool(worker.broker.config.connection_state.connection.is_connected)}
    }
    # the index only where this process's roles use it (an extract/redact process never
    # opens it): readers take the index's count from a worker that reports it
    probes = {"postgres": worker.pg.count()}
    if holds_index(worker.settings.stages):
        probes["index"] = worker.vectors.count()
    found = await asyncio.gather(*(_probe(p) for p in probes.values()))
    health.update(zip(probes, found, strict=True))
    return {
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "roles": list(worker.settings.stages),
        "stages": stages,
        "redactions": dict(worker.deps.metrics["redact"].redactions)
        if "redact" in worker.deps.metrics
        else {},
        "recall": {
            "served": worker.recall.served,
            "failed": worker.recall.failed,
            "latencies_ms": [round(x, 3) for x in worker.recall.latencies_ms],
        },
        "cache": None if cache is None else {"hits": cache.hits, "misses": cache.misses},
        # the index's optimizations that built something (each pauses the process that
        # holds a Qdrant Edge shard): how many, and their seconds in all
        "index_optimizations": {"count": worker.optimizations, "seconds": worker.optimized_s},
        # the steps of its stored batches (``stagemetrics.STEPS``): seconds in all, and batches
        "steps": {
            step: {"seconds": seconds, "count": int(count)}
            for step, (seconds, count) in worker.deps.steps.items()
        },
        "dev_redaction_key": bool(getattr(worker, "dev_redaction_key", False)),
        "health": health,
    }


async def answer(worker: Any, nc: Any) -> Any:
    """Subscribe this worker to the stats subject; returns the subscription."""

    async def reply(msg: Any) -> None:
        if not safe_reply(msg.reply, worker.settings.namespace):  # answers go to inboxes only
            return
        try:
            data = json.dumps(await snapshot(worker)).encode()
        except Exception as exc:  # noqa: BLE001 - a stats request must never take the worker down
            log.warning("ops.stats_failed", error=type(exc).__name__)
            data = json.dumps({"worker": f"{socket.gethostname()}:{os.getpid()}"}).encode()
        await msg.respond(data)

    return await nc.subscribe(worker.deps.subjects.ops("stats"), cb=reply)


REDACT_MAX_CHARS = 256 * 1024  # what the console shows of one dead letter


async def answer_redact(worker: Any, nc: Any) -> Any:
    """Redact texts for the console (``<ns>.ops.redact``, queue group): dead-letter bodies and
    reasons are shown through the workers' redaction (key and tenant policies), so a console
    anywhere (the gateway's) needs no redaction key. The texts already travel over NATS in the
    dead-letter stream; the reply carries only redacted text and counts by label."""

    def redact(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for item in items:
            r = worker.redactor.redact(str(item.get("text", ""))[:REDACT_MAX_CHARS], item["tenant"])
            out.append({"text": r.text, "counts": dict(r.counts)})
        return out

    async def reply(msg: Any) -> None:
        if not safe_reply(msg.reply, worker.settings.namespace):  # answers go to inboxes only
            return
        data: dict[str, Any]
        try:
            items = json.loads(msg.data)["items"]
            data = {"items": await asyncio.to_thread(redact, items)}
        except (ValueError, KeyError, TypeError, AttributeError):
            data = {"error": "bad request"}
        await msg.respond(json.dumps(data).encode())

    s = worker.deps.subjects
    return await nc.subscribe(s.ops("redact"), queue=s.queue_group, cb=reply)


async def answers(
    nc: Any,
    subject: str,
    wait_s: float,
    enough: Callable[[dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Every answer to one request on ``subject`` (no queue group: each worker answers) that
    arrives within ``wait_s``; or those until the first that is ``enough``."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    found: list[dict[str, Any]] = []
    try:
        await nc.publish(subject, b"", reply=inbox)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            with contextlib.suppress(ValueError):
                found.append(json.loads(msg.data))
                if enough is not None and enough(found[-1]):
                    break
    finally:
        await sub.unsubscribe()
    return found
