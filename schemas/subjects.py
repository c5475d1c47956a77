"""Every subject, stream and durable name in one place.

| subject                                   | kind                              |
|-------------------------------------------|-----------------------------------|
| mem.turns.<tenant>.<owner>.<session>      | JetStream MEM_TURNS (limits)      |
| mem.stage.<stage>.<tenant>                | JetStream MEM_STAGES (work queue) |
| mem.events.<tenant>                       | JetStream MEM_EVENTS (retained)   |
| mem.dlq.<stage>                           | JetStream MEM_DLQ                 |
| mem.recall                                | core request-reply, queue group   |
| mem.cmd.<verb>                            | core request-reply, queue group   |

``mem.recall`` and ``mem.cmd.*`` are outside every stream's subjects, so no
stream captures a request and answers it with a PubAck.
"""

from __future__ import annotations

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

PREFIX = "mem"
STREAM_TURNS = "MEM_TURNS"
STREAM_STAGES = "MEM_STAGES"
STREAM_EVENTS = "MEM_EVENTS"
STREAM_DLQ = "MEM_DLQ"

STAGES = ("extract", "redact", "dedupe", "store")
RECALL = f"{PREFIX}.recall"
QUEUE_GROUP = "memstream-workers"
DLQ_REASON_HEADER = "Memstream-Dlq-Reason"
DLQ_STAGE_HEADER = "Memstream-Dlq-Stage"
MSG_ID_HEADER = "Nats-Msg-Id"


def token(value: str) -> str:
    """Encode an id as one subject token: ``.``, ``*``, ``>``, spaces and any other
    character outside ``[A-Za-z0-9_-]`` become ``%XX`` (UTF-8 bytes). Injective."""
    if not value:
        return "%00"
    out: list[str] = []
    for ch in value:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def untoken(tok: str) -> str:
    """Inverse of :func:`token`."""
    if tok == "%00":
        return ""
    raw = bytearray()
    i = 0
    while i < len(tok):
        if tok[i] == "%":
            raw.append(int(tok[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(tok[i].encode("ascii"))
            i += 1
    return raw.decode("utf-8")


def turns(tenant: str, owner: str, session: str) -> str:
    return f"{PREFIX}.turns.{token(tenant)}.{token(owner)}.{token(session)}"


def turns_filter(tenant: str, owner: str | None = None) -> str:
    """Subject filter for one tenant's (or one owner's) raw turns, for purges."""
    if owner is None:
        return f"{PREFIX}.turns.{token(tenant)}.>"
    return f"{PREFIX}.turns.{token(tenant)}.{token(owner)}.*"


def stage(name: str, tenant: str) -> str:
    return f"{PREFIX}.stage.{name}.{token(tenant)}"


def stage_filter(name: str) -> str:
    return f"{PREFIX}.stage.{name}.*"


def events(tenant: str) -> str:
    return f"{PREFIX}.events.{token(tenant)}"


def dlq(stage_name: str) -> str:
    return f"{PREFIX}.dlq.{stage_name}"


def cmd(verb: str) -> str:
    return f"{PREFIX}.cmd.{verb}"


def durable(stage_name: str) -> str:
    return f"memstream-{stage_name}"
