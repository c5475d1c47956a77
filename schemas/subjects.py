"""Every subject, stream and durable name in one place.

| subject                                   | kind                              |
|-------------------------------------------|-----------------------------------|
| mem.turns.<tenant>.<owner>.<session>      | JetStream MEM_TURNS (limits)      |
| mem.stage.<stage>.<tenant>.<owner>        | JetStream MEM_STAGES (work queue) |
| mem.events.<tenant>                       | JetStream MEM_EVENTS (retained)   |
| mem.dlq.<stage>                           | JetStream MEM_DLQ                 |
| mem.recall                                | core request-reply, queue group   |
| mem.cmd.<verb>                            | core request-reply, queue group   |

A stage subject names the candidate's owner (its ``owner_key``: user and agent) so that a
flush counts the caller's own candidates in flight with one server-side count, never another
owner's. ``mem.stage.<stage>.<tenant>`` (no owner) is still consumed: candidates published
before the owner was in the subject.

``mem.recall`` and ``mem.cmd.*`` are outside every stream's subjects, so no
stream captures a request and answers it with a PubAck. The ``mem`` prefix is
configurable (``MEMSTREAM_NAMESPACE``) so that several deployments, or tests,
share one NATS server without seeing each other; stream names follow it
(``mem`` -> ``MEM_TURNS``).
"""

from __future__ import annotations

from dataclasses import dataclass

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

STAGES = ("extract", "redact", "dedupe", "store")
DLQ_REASON_HEADER = "Memstream-Dlq-Reason"
DLQ_STAGE_HEADER = "Memstream-Dlq-Stage"
DLQ_SUBJECT_HEADER = "Memstream-Dlq-Subject"
DLQ_BODY_HEADER = "Memstream-Dlq-Body"  # set when the body was too large to keep
DLQ_DELIVERIES_HEADER = "Memstream-Dlq-Deliveries"  # deliveries before the stage gave up
MSG_ID_HEADER = "Nats-Msg-Id"


def token(value: str) -> str:
    """Encode an id as one subject token: ``.``, ``*``, ``>``, spaces and any other
    character outside ``[A-Za-z0-9_-]`` become ``%XX`` (UTF-8 bytes). Injective: the empty
    id is a lone ``%``, which no other id encodes to (``%`` itself is ``%25``, NUL ``%00``)."""
    if not value:
        return "%"
    out: list[str] = []
    for ch in value:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def msg_id(tenant: str, key: str) -> str:
    """The ``Nats-Msg-Id`` of a publish: the key scoped by tenant. A stream's duplicate window
    spans tenants, so two tenants' equal event ids must not collide; the tenant's token holds
    no ``.``, so the pair is recoverable from the id (injective)."""
    return f"{token(tenant)}.{key}"


def valid_token(tok: str) -> bool:
    """Whether ``tok`` is something :func:`token` can produce (so :func:`untoken` reads it)."""
    if not tok:
        return False
    i = 0
    while i < len(tok):
        if tok[i] == "%":
            if len(tok) < i + 3 or any(c not in "0123456789ABCDEF" for c in tok[i + 1 : i + 3]):
                return False
            i += 3
        elif tok[i] in _SAFE:
            i += 1
        else:
            return False
    try:
        untoken(tok)
    except UnicodeDecodeError:
        return False
    return True


def untoken(tok: str) -> str:
    """Inverse of :func:`token`."""
    if tok == "%":
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


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subject and stream names under one namespace prefix (default ``mem``)."""

    prefix: str = "mem"

    def __post_init__(self) -> None:
        if not self.prefix or any(ch not in _SAFE for ch in self.prefix):
            raise ValueError("namespace must match [A-Za-z0-9_-]+")

    def stream(self, kind: str) -> str:
        """``turns`` -> ``MEM_TURNS``."""
        return f"{self.prefix.upper().replace('-', '_')}_{kind.upper()}"

    @property
    def recall(self) -> str:
        return f"{self.prefix}.recall"

    @property
    def queue_group(self) -> str:
        return f"{self.prefix}-workers"

    def turns(self, tenant: str, owner: str, session: str) -> str:
        return f"{self.prefix}.turns.{token(tenant)}.{token(owner)}.{token(session)}"

    def turns_filter(self, tenant: str | None = None, owner: str | None = None) -> str:
        """All raw turns, one tenant's, or one owner's (for erasure purges)."""
        if tenant is None:
            return f"{self.prefix}.turns.>"
        if owner is None:
            return f"{self.prefix}.turns.{token(tenant)}.>"
        return f"{self.prefix}.turns.{token(tenant)}.{token(owner)}.*"

    def stage(self, name: str, tenant: str, owner: str | None = None) -> str:
        """A candidate's stage subject; ``owner`` is its ``Owner.key``. Without it, the
        tenant-wide form of candidates published before the owner was in the subject."""
        base = f"{self.prefix}.stage.{name}.{token(tenant)}"
        return base if owner is None else f"{base}.{token(owner)}"

    def stage_filter(self, name: str | None = None) -> str:
        return f"{self.prefix}.stage.>" if name is None else f"{self.prefix}.stage.{name}.>"

    def stage_owner_filter(self, tenant: str, owner: str) -> str:
        """One owner's candidates in every stage (``owner``: an ``Owner.key``)."""
        return f"{self.prefix}.stage.*.{token(tenant)}.{token(owner)}"

    def events(self, tenant: str | None = None) -> str:
        return (
            f"{self.prefix}.events.>" if tenant is None else f"{self.prefix}.events.{token(tenant)}"
        )

    def dlq(self, stage_name: str | None = None) -> str:
        return f"{self.prefix}.dlq.>" if stage_name is None else f"{self.prefix}.dlq.{stage_name}"

    def cmd(self, verb: str) -> str:
        return f"{self.prefix}.cmd.{verb}"

    def ops(self, what: str) -> str:
        """Core request-reply for operators (``stats``): every worker answers, no queue group,
        outside every stream's subjects."""
        return f"{self.prefix}.ops.{what}"

    def durable(self, stage_name: str) -> str:
        return f"{self.prefix}-{stage_name}"

    def parse_turns(self, subject: str) -> tuple[str, str, str] | None:
        """(tenant, owner, session) of a turn subject of this namespace, else None."""
        parts = subject.split(".")
        if len(parts) != 5 or parts[:2] != [self.prefix, "turns"]:
            return None
        if not all(valid_token(t) for t in parts[2:]):
            return None
        return untoken(parts[2]), untoken(parts[3]), untoken(parts[4])

    def parse_stage(self, subject: str) -> tuple[str, str] | None:
        """(stage, tenant) of a stage subject of this namespace (with or without its owner
        token), else None."""
        parts = subject.split(".")
        if len(parts) not in (4, 5) or parts[:2] != [self.prefix, "stage"]:
            return None
        if parts[2] not in STAGES or not all(valid_token(t) for t in parts[3:]):
            return None
        return parts[2], untoken(parts[3])

    def turn_mismatch(self, subject: str, tenant: str, owner: str, session: str) -> str | None:
        """Why a turn body does not belong on ``subject`` (None when it does): the subject is
        what publish permissions are granted on, so the body may not name another tenant,
        owner or session than the subject it arrived on."""
        if subject == self.turns(tenant, owner, session):
            return None
        return "the turn's tenant, owner or session disagrees with its subject"

    def stage_mismatch(self, subject: str, stage: str, tenant: str, owner: str) -> str | None:
        """Why a candidate does not belong on the stage subject it arrived on (None when it
        does): another stage's subject, or another tenant or owner than the body's."""
        if subject in (self.stage(stage, tenant, owner), self.stage(stage, tenant)):
            return None
        return (
            "the candidate's tenant or owner disagrees with its subject "
            f"(or it is not a {stage} subject)"
        )

    def replayable(self, subject: str) -> bool:
        """Whether a dead letter may be sent back to ``subject``: only this namespace's own
        turn and stage subjects (the header naming it is data, not an instruction)."""
        return self.parse_turns(subject) is not None or self.parse_stage(subject) is not None
