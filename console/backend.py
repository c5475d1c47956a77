"""What the console reads and does, over NATS only: JetStream stream and consumer info, the
workers' ``ops.stats`` answers, the dead-letter stream, ``mem.recall`` and ``mem.cmd.*``. What it
does with dead letters is in ``dead_letters.py``.

The console holds no state a restart loses (the counters' previous samples, for rates, are a
convenience). Every action publishes an audit event on ``mem.events.<tenant>`` (the tenant the
action concerns, or ``_console`` when none): the action and ids, never a token, a key, a query
or a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import nats
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from memstream.console.dead_letters import DeadLetters
from memstream.console.errors import ConsoleError
from memstream.console.overview import Rates, summary
from memstream.producers.connection import let_go, request
from memstream.schemas.commands import VERBS, CommandReply
from memstream.schemas.errors import ErrorReply, describe
from memstream.schemas.memory import MemoryEvent
from memstream.schemas.recall import RecallReply, RecallRequest
from memstream.schemas.settings import Settings

if TYPE_CHECKING:  # a type only: the gateway mounts the console without the pipeline installed
    from memstream.pipeline.redact import Redacts
from memstream.schemas.subjects import MSG_ID_HEADER, STAGES, Subjects

AUDIT_TENANT = "_console"  # audit events of actions that concern no tenant (login, logout)
STREAM_KINDS = ("turns", "stages", "events", "dlq")
# How long to wait for the first worker's stats answer, then for the others. A worker answers
# once its store probes have (each bounded at 1 s: consumers/opsstats.py), and a loaded one
# takes hundreds of milliseconds: with 0.3 s the overview showed busy workers as absent. Within
# the overview's 2 s refresh, so an empty fleet still shows before the next one.
STATS_WAIT_S = 1.5
STATS_STRAGGLERS_S = 0.1
HIDDEN = "(hidden: no worker answered to redact it)"
EVENT_SCAN = 2000  # how far back the events page looks for one tenant's events


@dataclass(frozen=True)
class Caller:
    """The owner whose memories the Memories page shows (ids, and the tenant's key if the
    deployment requires one: it is sent with each request and never rendered)."""

    tenant: str
    user: str | None = None
    agent: str | None = None
    api_key: str | None = field(default=None, repr=False)


@dataclass
class ConsoleBackend(DeadLetters):
    """The console's one port to the system: a NATS connection, settings and the deployment's
    redaction (its key and tenant policies, so placeholders match the stored memories')."""

    settings: Settings
    nc: Any
    # None: dead letters are redacted by the workers (<ns>.ops.redact), so a console outside
    # them (the gateway's) needs no redaction key
    redactor: Redacts | None = None
    owns_connection: bool = False
    _rates: Rates = field(default_factory=Rates)

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        nats_url: str,
        redactor: Redacts | None = None,
        connect_options: dict[str, Any] | None = None,
    ) -> ConsoleBackend:
        """A backend with a connection of its own; ``connect_options`` are the NATS
        credentials (``nats.connect`` keyword arguments) of the process that serves it."""
        nc = await nats.connect(
            nats_url,
            name="memstream-console",
            max_reconnect_attempts=-1,
            **(connect_options or {}),
        )
        return cls(settings, nc, redactor, owns_connection=True)

    async def close(self) -> None:
        if self.owns_connection:
            with contextlib.suppress(NatsError, TimeoutError):  # lost: nothing left to drain
                await let_go(self.nc)  # NATS away: closed, not left reconnecting

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.settings.namespace)

    @property
    def js(self) -> Any:
        return self.nc.jetstream()

    # --- overview -----------------------------------------------------------------------

    async def worker_stats(self) -> list[dict[str, Any]]:
        """Every worker's ``ops.stats`` answer (scatter-gather: no queue group)."""
        inbox = self.nc.new_inbox()
        answers: list[dict[str, Any]] = []
        first = asyncio.Event()

        async def collect(msg: Any) -> None:
            with contextlib.suppress(ValueError):
                answers.append(json.loads(msg.data))
            first.set()

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            await self.nc.publish(self.subjects.ops("stats"), b"", reply=inbox)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(first.wait(), STATS_WAIT_S)
                await asyncio.sleep(STATS_STRAGGLERS_S)  # the other workers
        finally:
            await sub.unsubscribe()
        return answers

    async def jetstream(self) -> dict[str, Any]:
        """Consumer lag per stage, stream sizes, dead letters per stage."""
        s, js = self.subjects, self.js
        consumers: dict[str, dict[str, int] | None] = {}
        for stage in STAGES:
            stream = s.stream("turns" if stage == "extract" else "stages")
            try:
                info = await js.consumer_info(stream, s.durable(stage))
            except (NatsError, TimeoutError):
                consumers[stage] = None
                continue
            consumers[stage] = {
                "pending": info.num_pending or 0,
                "ack_pending": info.num_ack_pending or 0,
                "redelivered": info.num_redelivered or 0,
                "waiting": info.num_waiting or 0,
            }
        streams: dict[str, dict[str, int] | None] = {}
        for kind in STREAM_KINDS:
            try:
                state = (await js.stream_info(s.stream(kind))).state
                streams[kind] = {"messages": state.messages, "bytes": state.bytes}
            except (NatsError, TimeoutError):
                streams[kind] = None
        dlq: dict[str, int] = dict.fromkeys(STAGES, 0)
        with contextlib.suppress(NatsError, TimeoutError):
            info = await js.stream_info(s.stream("dlq"), subjects_filter=s.dlq())
            for subject, n in (info.state.subjects or {}).items():
                dlq[subject.rsplit(".", 1)[-1]] = n
        return {"consumers": consumers, "streams": streams, "dlq": dlq}

    async def overview(self) -> dict[str, Any]:
        """The overview page's figures (``console/overview.py``)."""
        workers, jet = await asyncio.gather(self.worker_stats(), self.jetstream())
        return summary(workers, jet, self._rates, bool(self.nc.is_connected))

    # --- stream reads and redaction (the dead letters' methods use them) ------------------

    async def _read(self, subject: str, stream: str, limit: int, start_seq: int = 0) -> list[Any]:
        """Up to ``limit`` messages of a stream from ``start_seq`` (or all), not consumed."""
        config = None
        if start_seq:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq
            )
        try:
            sub = await self.js.subscribe(
                subject, stream=stream, ordered_consumer=True, config=config
            )
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError(f"stream {stream} cannot be read") from exc
        out: list[Any] = []
        try:
            while len(out) < limit:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except NatsTimeout:
                    break
                out.append(msg)
                if not msg.metadata.num_pending:  # the last one there is: no need to wait
                    break
        finally:
            await sub.unsubscribe()
        return out

    async def redact(self, items: list[tuple[str | None, str]]) -> list[tuple[str, dict[str, int]]]:
        """(tenant, text) pairs redacted, with counts by label: locally when the console has
        the redactor, else by a worker. Never the text in clear: if no worker answers, a
        notice takes its place."""
        if self.redactor is not None:
            done = [self.redactor.redact(text, tenant or AUDIT_TENANT) for tenant, text in items]
            return [(r.text, dict(r.counts)) for r in done]
        payload = {"items": [{"tenant": t or AUDIT_TENANT, "text": x} for t, x in items]}
        try:
            msg = await request(
                self.nc, self.subjects.ops("redact"), json.dumps(payload).encode(), 5.0
            )
            answered = json.loads(msg.data)["items"]
            return [(str(a["text"]), dict(a["counts"])) for a in answered]
        except (NatsError, TimeoutError, ValueError, KeyError, TypeError):
            return [(HIDDEN, {}) for _ in items]

    # --- memories -------------------------------------------------------------------------

    async def _request(self, subject: str, payload: bytes) -> bytes:
        try:
            msg = await request(self.nc, subject, payload, self.settings.recall_timeout_s * 5)
        except NoRespondersError:
            raise ConsoleError("no memory worker is running") from None
        except (TimeoutError, NatsTimeout):
            raise ConsoleError("no answer from the workers in time") from None
        except (NatsError, OSError):
            raise ConsoleError("the memory service is unreachable") from None
        return bytes(msg.data)

    async def command(self, verb: str, caller: Caller, **fields: Any) -> CommandReply:
        """``mem.cmd.<verb>`` as the caller; audited when it changes something."""
        try:
            req = VERBS[verb](
                tenant=caller.tenant,
                user=caller.user,
                agent=caller.agent,
                api_key=caller.api_key,
                **fields,
            )
        except ValidationError as exc:
            raise ConsoleError(describe(exc)) from None
        data = await self._request(self.subjects.cmd(verb), req.model_dump_json().encode())
        body = json.loads(data)
        if body.get("ok") is False:
            raise ConsoleError(ErrorReply.model_validate(body).error.message)
        if verb not in ("list", "get"):
            await self.audit(
                f"memory.{verb}", caller.tenant, memory=fields.get("id"), **_owner(caller)
            )
        return CommandReply.model_validate(body)

    async def recall(self, caller: Caller, query: str, **options: Any) -> RecallReply:
        """A recall as the caller (audited without the query)."""
        try:
            req = RecallRequest(
                tenant=caller.tenant,
                user=caller.user,
                agent=caller.agent,
                api_key=caller.api_key,
                query=query,
                **options,
            )
        except ValidationError as exc:
            raise ConsoleError(describe(exc)) from None
        data = await self._request(self.subjects.recall, req.model_dump_json().encode())
        await self.audit("memory.recall", caller.tenant, method=req.method.value, **_owner(caller))
        try:
            return RecallReply.model_validate_json(data)
        except ValidationError:
            pass
        try:
            raise ConsoleError(ErrorReply.model_validate_json(data).error.message)
        except ValidationError:
            raise ConsoleError("the recall reply could not be read") from None

    # --- events and audit -------------------------------------------------------------------

    async def events(
        self, limit: int = 100, tenant: str | None = None
    ) -> list[tuple[int, MemoryEvent]]:
        """The newest ``limit`` memory events, newest first (their ids and kinds); of one
        tenant: its newest among the stream's latest ``EVENT_SCAN`` events."""
        s = self.subjects
        try:
            last = (await self.js.stream_info(s.stream("events"))).state.last_seq
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError("the events stream cannot be read") from exc
        if not last:
            return []
        window = limit if tenant is None else EVENT_SCAN
        msgs = await self._read(
            s.events(tenant), s.stream("events"), EVENT_SCAN, max(1, last - window + 1)
        )
        msgs = msgs[-limit:]
        out: list[tuple[int, MemoryEvent]] = []
        for m in msgs:
            with contextlib.suppress(ValidationError):
                out.append((m.metadata.sequence.stream, MemoryEvent.model_validate_json(m.data)))
        return out[::-1]

    async def audit(self, action: str, tenant: str | None, **detail: Any) -> None:
        """An audit event on ``mem.events.<tenant>``: the action and ids, nothing secret."""
        event = MemoryEvent(
            kind=f"console.{action}",
            tenant=tenant or AUDIT_TENANT,
            memory_id=detail.pop("memory", None),
            user=detail.pop("user", None),
            agent=detail.pop("agent", None),
            at=datetime.now(UTC),
            detail={k: v for k, v in detail.items() if v is not None},
        )
        try:
            await self.js.publish(
                self.subjects.events(event.tenant),
                event.model_dump_json().encode(),
                headers={MSG_ID_HEADER: f"console:{uuid.uuid4()}"},
                timeout=5.0,
            )
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError(
                f"the audit event could not be stored: {type(exc).__name__}"
            ) from exc


def _owner(caller: Caller) -> dict[str, str | None]:
    return {"user": caller.user, "agent": caller.agent}
