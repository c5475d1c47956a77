"""Composition root: settings -> stores, stages, subscribers, responders.

``Worker`` runs the stages of its settings' roles (``Settings.stages``; all by default:
extract, redact, dedupe, store), and with the ``recall`` role the recall and command
responders, with the ``store`` role the index maintenance (consumers/maintenance.py), on one
FastStream NATS broker. Run several processes to scale (consumers/roles.py): durable pull
consumers share the work, the responders are queue-group members.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import nats
from faststream import AckPolicy
from faststream.nats import JStream, PullSub
from faststream.nats.annotations import NatsMessage
from pydantic import ValidationError

from memstream.consumers import opsstats, topology
from memstream.consumers.auth import Authenticator
from memstream.consumers.batching import BatchRunner, PullLoops
from memstream.consumers.busauth import safe_reply
from memstream.consumers.cache import RecallCache
from memstream.consumers.chains import batch_stage, chain_of
from memstream.consumers.commands import CommandService
from memstream.consumers.extractors import LlmExtractor
from memstream.consumers.healing import Healer
from memstream.consumers.logs import log
from memstream.consumers.maintenance import Maintenance
from memstream.consumers.metrics import WorkerMetrics
from memstream.consumers.natsconn import (
    WorkerBroker,
    api_keys_required,
    broker_options,
    leave_queue,
    nats_options,
    reconnect_forever,
)
from memstream.consumers.quietgc import quieter_gc
from memstream.consumers.recall import (
    TOUCH_STOP_S,
    IndexBusy,
    RecallService,
    error_reply,
    record_read,
)
from memstream.consumers.runner import StageRunner
from memstream.consumers.services import Services
from memstream.consumers.stages import STAGE_WORK, Deps
from memstream.producers.connection import display_url, let_go, servers
from memstream.schemas.commands import VERBS
from memstream.schemas.errors import ErrorCode, MemstreamError, PermanentError, describe
from memstream.schemas.recall import RecallReply, RecallRequest
from memstream.schemas.subjects import STAGES, Subjects
from memstream.storage.ports import VectorIndex


@dataclass
class Worker(Maintenance):
    services: Services
    nats_url: str
    broker: WorkerBroker = field(init=False)
    deps: Deps = field(init=False)
    recall: RecallService = field(init=False)
    commands: CommandService = field(init=False)
    auth: Authenticator = field(init=False)
    telemetry: WorkerMetrics = field(init=False)  # this worker's Prometheus registry
    # keyed with the state directory's development key (memstream dev, --dev-redaction-key):
    # reported in <ns>.ops.stats for memstream doctor
    dev_redaction_key: bool = field(init=False, default=False)
    _nc: Any = field(init=False, default=None)
    _reconciler: asyncio.Task[None] | None = field(init=False, default=None)
    healer: Healer | None = field(init=False, default=None)
    _floors: asyncio.Task[None] | None = field(init=False, default=None)
    _tasks: set[asyncio.Task[Any]] = field(init=False, default_factory=set)
    _recall_sub: Any = field(init=False, default=None)
    _command_subs: list[Any] = field(init=False, default_factory=list)  # faststream's
    _stats_sub: Any = field(init=False, default=None)
    _redact_sub: Any = field(init=False, default=None)
    _recall_slots: asyncio.Semaphore = field(
        init=False, default_factory=lambda: asyncio.Semaphore(64)
    )
    _recall_pending: int = field(init=False, default=0)
    # the optimizations of the index that built something: how many, and their seconds in
    # all (ops.stats: the ingest benchmark reports those that fell in its runs)
    optimizations: int = field(init=False, default=0)
    optimized_s: float = field(init=False, default=0.0)
    _stopping: bool = field(init=False, default=False)
    # set when a NATS connection closed for good (it reconnects forever, so only if the
    # client gave up anyway): `memstream worker` then exits non-zero for its supervisor
    lost: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    async def start(self) -> None:
        quieter_gc()
        s = Subjects(self.settings.namespace)
        self._nc = await nats.connect(
            servers(self.nats_url),
            name="memstream-worker-control",
            **nats_options(self.settings),
            **reconnect_forever(self._closed),
        )
        js = self._nc.jetstream()
        topo = await topology.apply(js, self.settings)
        self.telemetry = WorkerMetrics(self)
        if hasattr(self.vectors, "on_optimized"):  # Qdrant Edge optimizes as writes make it due
            self.vectors.on_optimized = self.index_optimized
        cache = None
        if self.settings.recall_cache_ttl_s:
            cache = RecallCache(
                js,
                f"{s.stream('recall_cache')}",
                self.settings.recall_cache_ttl_s,
                self.settings.stream_replicas,
            )
            await cache.start()
        self.deps = Deps(
            self.services,
            s,
            js,
            max_payload=self._nc.max_payload,
            cache=cache,
            llm=(
                LlmExtractor(self.settings.llm, self.redactor)
                if self.settings.extractor == "rules+llm" and self.settings.llm is not None
                else None
            ),
            telemetry=self.telemetry,
        )
        self.recall = RecallService(self.services)
        self.recall.telemetry = self.telemetry
        self.auth = Authenticator(self.services.store, api_keys_required(self.settings))
        self.commands = CommandService(self.deps, self.recall, self.auth)
        self.broker = WorkerBroker(
            servers(self.nats_url),
            ack_policy=AckPolicy.MANUAL,
            logger=None,
            name="memstream-worker",
            graceful_timeout=10.0,
            **broker_options(self.settings),
            **reconnect_forever(self._closed),
        )
        batched: dict[str, tuple[str, str, BatchRunner]] = {}
        roles = self.settings.stages
        # each stage handed on in memory through the next ones this process runs too
        stage_cfg = self.settings.stage
        chains = chain_of(STAGES, roles) if stage_cfg.batched and stage_cfg.fused else {}
        for stage in (stage for stage in STAGES if stage in roles):
            stream, ccfg = topo.consumers[stage]
            if self.settings.stage.batched:
                work = batch_stage(chains.get(stage, (stage,)), self.services.helper is not None)
                batch_runner = BatchRunner(stage, self.deps, work)
                batched[stage] = (stream, ccfg.durable_name or "", batch_runner)
                continue
            runner = StageRunner(stage, self.deps, STAGE_WORK[stage])
            self.broker.subscriber(
                ccfg.filter_subject or "",
                stream=JStream(stream, declare=False),
                durable=ccfg.durable_name,
                pull_sub=PullSub(batch_size=self.settings.stage.batch_size, timeout=1.0),
                ack_policy=AckPolicy.MANUAL,
            )(self._handler(runner))
        if "recall" in roles:
            await self._answer_requests(s)
        await self.broker.start()
        self._stats_sub = await opsstats.answer(self, self._nc)
        self._redact_sub = await opsstats.answer_redact(self, self._nc)
        if batched and self.services.helper is not None:
            await self.services.helper.start()
        if batched:
            self.healer = Healer(js, self.settings, batched)
            await self.healer.note_floors()
            self._floors = asyncio.create_task(self.healer.watch())
            self.broker.pulls = PullLoops(
                self._nc,
                batched,
                self.settings.stage.batch_size,
                self.settings.stage.ack_wait_s,
                heal=self.healer.heal,
            )
            await self.broker.pulls.start()
        if "store" in roles:  # the index's maintenance goes with the stage that writes it
            if await self._left_behind():
                self.deps.index_behind.set()  # the first maintenance round at once
            self._reconciler = asyncio.create_task(self._reconcile_forever())
        log.info(
            "worker.started",
            nats=display_url(self.nats_url),
            namespace=s.prefix,
            stages=list(roles),
            fused={first: "+".join(c) for first, c in chains.items() if len(c) > 1},
        )

    async def _answer_requests(self, s: Subjects) -> None:
        """The recall responder and the command responders (queue groups: one process of
        the deployment answers each request)."""
        self._recall_sub = await self._subscribe_recall(self.recall)
        handlers = {verb: self._command_handler(verb) for verb in VERBS}
        handlers["whoami"] = self._whoami_handler()
        for verb, handler in handlers.items():
            subscriber = self.broker.subscriber(
                s.cmd(verb), queue=s.queue_group, ack_policy=AckPolicy.MANUAL
            )
            subscriber(handler)
            self._command_subs.append(subscriber)

    @staticmethod
    def _handler(runner: StageRunner) -> Any:
        async def handle(msg: NatsMessage) -> None:
            await runner(msg)

        handle.__name__ = f"stage_{runner.name}"
        return handle

    def _command_handler(self, verb: str) -> Any:
        async def handle(msg: NatsMessage) -> bytes:
            if not safe_reply(msg.reply_to, self.settings.namespace):
                log.warning("command.refused", verb=verb, reason="reply subject is not an inbox")
                msg.reply_to = ""  # FastStream answers on reply_to after the handler: do not
                return b""
            return await self.commands.handle(verb, msg.body)

        handle.__name__ = f"cmd_{verb}"
        return handle

    def _whoami_handler(self) -> Any:
        async def cmd_whoami(msg: NatsMessage) -> bytes:
            return await self.commands.whoami(msg.body)

        return cmd_whoami

    async def _closed(self) -> None:
        if self._stopping:
            return
        if not self.lost.is_set():
            log.error("worker.nats_closed", action="exiting for the supervisor to restart")
        self.lost.set()

    async def _subscribe_recall(self, service: RecallService) -> Any:
        # Recall is the hot path: a plain nats-py queue subscription, so no broker middleware
        # adds to every request's latency; each request in its own task.
        async def message(msg: Any) -> None:
            await self._recall_message(msg, service)

        s = self.deps.subjects
        return await self._nc.subscribe(
            s.recall, queue=s.queue_group, cb=message, pending_msgs_limit=100_000
        )

    async def recall_off(self) -> None:
        """Stop answering recall, once every request already routed here is answered: the
        worker that owns this index process answers it while the shard optimizes
        (``standby_recall``), and a request left here would wait for the optimize."""
        sub, self._recall_sub = self._recall_sub, None
        if sub is not None:
            # the requests the server routed here before it took this process out of the
            # group are still handed to the callback, none is dropped
            await leave_queue(self._nc, sub)
        if self._tasks:  # the requests' tasks (and their cache writes) finish first
            await asyncio.wait(set(self._tasks), timeout=self.settings.recall_deadline_s)

    async def recall_on(self) -> None:
        """Answer recall again (idempotent)."""
        if self._recall_sub is None:
            self._recall_sub = await self._subscribe_recall(self.recall)
            await self._nc.flush()

    @contextlib.asynccontextmanager
    async def standby_recall(self) -> AsyncIterator[None]:
        """Answer recall here, from Postgres, as during an index outage (the replies say
        ``vector_index`` degraded), for as long as the index process cannot: it holds the
        shard's interpreter lock for the whole of an optimize that builds."""
        busy = cast(VectorIndex, IndexBusy())
        service = RecallService(dataclasses.replace(self.services, vectors=busy))
        service.telemetry = self.telemetry
        sub = await self._subscribe_recall(service)
        try:
            await self._nc.flush()  # the server sends this process recall from now on
            yield
        finally:
            with contextlib.suppress(Exception):  # NATS away: the subscription goes with it
                await leave_queue(self._nc, sub)  # the requests routed here are answered
            self.recall.served += service.served
            self.recall.failed += service.failed

    async def _recall_message(self, msg: Any, service: RecallService) -> None:
        if msg.reply and not safe_reply(msg.reply, self.settings.namespace):
            log.warning("recall.refused", reason="reply subject is not an inbox")
            return
        if self._recall_pending >= self.settings.recall_max_pending:
            # overloaded: say so at once rather than queue without bound (each queued request
            # holds a task and its body); the agent may retry or go without memories
            service.failed += 1
            if msg.reply:
                await msg.respond(error_reply(ErrorCode.UNAVAILABLE, "recall is overloaded"))
            return
        self._recall_pending += 1
        self._spawn(self._answer_recall(msg, service))

    async def _answer_recall(self, msg: Any, service: RecallService) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.recall_deadline_s):
                async with self._recall_slots:  # bounded concurrency; the rest wait here
                    data = await self.answer_recall(msg.data, service)
        except TimeoutError:
            service.failed += 1
            data = error_reply(ErrorCode.TIMEOUT, "recall did not finish within its deadline")
        finally:
            self._recall_pending -= 1
            self.telemetry.recall_answered(time.perf_counter() - started)
        if msg.reply:
            with contextlib.suppress(Exception):  # the requester or NATS may be gone
                await msg.respond(data)

    async def answer_recall(self, body: bytes, service: RecallService | None = None) -> bytes:
        """One recall request in, one reply (RecallReply or ErrorReply) out; never raises.
        ``service``: the recall service that answers (this worker's by default)."""
        recall = self.recall if service is None else service
        try:
            req = RecallRequest.model_validate_json(body)
        except ValidationError as exc:
            recall.failed += 1
            return error_reply(ErrorCode.BAD_REQUEST, f"invalid recall request: {describe(exc)}")
        try:
            refusal = await self.auth.refuse(req.tenant, req.api_key, req.user, req.agent)
        except MemstreamError:
            refusal = "credentials cannot be checked right now"
        if refusal is not None:
            recall.failed += 1
            return error_reply(ErrorCode.UNAUTHORIZED, refusal)
        cache = self.deps.cache if req.cache else None
        key = cache.key(req) if cache is not None else ""
        if cache is not None and (cached := await cache.get(key)) is not None:
            recall.served += 1
            if req.activity is not None:  # a cached answer is a read too: its hits' ids
                hits = RecallReply.model_validate_json(cached).hits
                self._spawn(record_read(self.deps.pg, req.activity, req, hits))
            return cached
        try:
            reply = await recall.recall(req, touch=req.touch)
        except PermanentError as exc:
            recall.failed += 1
            return error_reply(ErrorCode.BAD_REQUEST, f"recall was refused: {exc}")
        except MemstreamError:
            recall.failed += 1
            return error_reply(ErrorCode.UNAVAILABLE, "recall is unavailable: no store answered")
        except Exception:  # noqa: BLE001 - the recall responder's one catch-all: the agent gets a code, never a traceback
            recall.failed += 1
            log.exception("recall.error", tenant=req.tenant)
            return error_reply(ErrorCode.INTERNAL, "recall failed inside the server")
        recall.served += 1
        if req.activity is not None:  # after the answer: Postgres away must not hold it
            self._spawn(record_read(self.deps.pg, req.activity, req, reply.hits))
        if cache is not None and not reply.degraded:
            self._spawn(cache.put(key, reply))
        return reply.model_dump_json().encode()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _leave_request_groups(self) -> None:
        """Leave the recall, command and console-redaction queue groups, answering every
        request already routed here (``leave_queue``): the deployment's other workers answer
        from now on, and in a rolling restart no agent's request is left to time out in a
        stopping worker (a plain unsubscribe, faststream's stop, drops what waits in the
        client)."""
        mine = (s for s in (self._recall_sub, self._redact_sub) if s is not None)
        leaving = [(self._nc, sub) for sub in mine]
        self._recall_sub = self._redact_sub = None
        for subscriber in self._command_subs:
            if subscriber.subscription is not None:
                leaving.append((subscriber.connection, subscriber.subscription))
                subscriber.subscription = None  # left here: faststream's stop skips it
        connected = all(nc is not None and nc.is_connected for nc, _ in leaving)
        if connected:
            left = await asyncio.gather(
                *(leave_queue(nc, sub) for nc, sub in leaving), return_exceptions=True
            )
            if failed := [type(e).__name__ for e in left if isinstance(e, BaseException)]:
                # NATS lost on the way: what was not answered times out at the agent
                log.warning("worker.leave_failed", groups=len(failed), error=failed[0])
        else:  # a drain waits for the server: the requests left time out at the agent
            for _, sub in leaving:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._reconciler, self._floors):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        closed = self._nc is None or self._nc.is_closed  # lost: nothing left to drain
        if self._stats_sub is not None and not closed:  # every worker answers: no group
            await self._stats_sub.unsubscribe()
        if not closed:
            await self._leave_request_groups()
        # a start stopped part way (a signal during start-up) has not made them all yet
        broker, recall, deps = (getattr(self, name, None) for name in ("broker", "recall", "deps"))
        if broker is not None:
            await broker.stop()
        if self.services.helper is not None:
            await self.services.helper.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if recall is not None:
            await recall.flush_touches_within(TOUCH_STOP_S)
        if deps is not None and deps.cache is not None:
            await deps.cache.stop()
        if deps is not None and deps.llm is not None:
            await deps.llm.close()
        if self._nc is not None and not closed:
            await let_go(self._nc)
