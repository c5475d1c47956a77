"""Agent middleware: recall before the model call, persist after it (seeds 000 and 001).

    mw = MemoryMiddleware(client)                    # client: a connected-or-not MemoryClient
    ctx = TurnContext([ChatMessage("system", "You are ..."),
                       ChatMessage("user", "where is my bike?")], chat_id="42")  # chat:42
    ctx = await mw.before_prompt(ctx)                # recall gates, injection, system rule
    out = await model(ctx)                           # your provider call
    await mw.after_prompt(ctx, out)                  # user prompt + final answer, fail-open

- ``before_prompt`` never raises and never waits longer than ``deadline_s`` for memory: on
  any failure the context goes on without recalled memory (plus the stable system rule).
- The recalled memories go into ONE message of role ``memory``, placed just before the current
  user input, never into the system prompt; the system prompt gets a stable rule saying that
  such a message is untrusted reference data. A ``memory`` message of an earlier turn is
  dropped from the context (it is ephemeral) and is never persisted.
- ``after_prompt`` publishes exactly the current user input and the final answer
  (``publish_turn(wait=False)``) and returns at once; it never raises. Tool calls, tool
  results, system text, reasoning and recalled text are never published. Once the add
  succeeded, the session is flushed once in the background (seed 000: add, then flush),
  waiting at most ``flush_s``; an add that failed is not flushed.
- ``on_tool_result`` records a verified outcome as a ``fix`` or ``lesson_learned`` memory.
- ``audit`` receives ``AuditEvent``s whose metadata are counts, scopes, reasons and error
  categories: never keys, queries or memory text. An audit callback that raises is ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from memstream.producers.client import MemoryClient, MemoryClientError, PublishResult
from memstream.producers.context import (
    MEMORY_RULE,
    AuditEvent,
    AuditName,
    AuditValue,
    ChatMessage,
    ModelOutput,
    RecalledMemory,
    ToolOutcome,
    TurnContext,
    inject,
    line,
    reference,
    with_rule,
    without_memory,
)
from memstream.producers.gates import (
    Decision,
    GatePolicy,
    TopicState,
    decide,
    fresh_state,
    recalled,
)
from memstream.schemas.errors import ErrorCode
from memstream.schemas.memory import MemoryType, Scope
from memstream.schemas.recall import MAX_QUERY_CHARS, Hit

__all__ = [
    "MEMORY_RULE",
    "AuditEvent",
    "ChatMessage",
    "MemoryMiddleware",
    "ModelOutput",
    "RecalledMemory",
    "ToolOutcome",
    "TurnContext",
]

_CHARS_PER_TOKEN = 4  # the same estimate as the recall responder's token budget
_MAX_SESSIONS = 4096  # gate states kept (least recently used dropped)
_ADD_WAIT_S = 30.0  # beyond the client's retry_for_s, the wait for an add's outcome


class MemoryMiddleware:
    """Recall-before and persist-after around a model call, over a ``MemoryClient``.

    Options: ``top_k`` memories at most (1..100; seed 001 suggests 3..8), ``token_budget``
    for the reference message, ``min_score`` on the calibrated score (docs/recall.md),
    ``keep_degraded``: whether the hits of a degraded reply (keyword recall only, which has no
    calibrated score to hold to ``min_score``: seed 001's fallback) are injected, as ranked,
    ``deadline_s`` for recall,
    ``context`` / ``scopes`` / ``types`` narrow what is searched (the client's owner always
    bounds it), ``project`` is sent with recall and turns, ``gates`` tune the recall gates,
    ``audit`` receives ``AuditEvent``s, ``flush_s`` bounds the flush after each add (None:
    no flush).
    """

    def __init__(
        self,
        client: MemoryClient,
        *,
        top_k: int = 5,
        token_budget: int = 600,
        min_score: float = 0.2,
        keep_degraded: bool = True,
        deadline_s: float = 0.5,
        context: Literal["all", "session", "resources"] = "all",
        scopes: Sequence[str] = (),
        types: Sequence[str] = (),
        project: str | None = None,
        gates: GatePolicy | None = None,
        audit: Callable[[AuditEvent], object] | None = None,
        system_rule: str = MEMORY_RULE,
        clock: Callable[[], float] = time.monotonic,
        flush_s: float | None = 8.0,
    ) -> None:
        if not 1 <= top_k <= 100:
            raise ValueError("top_k must be 1..100")
        if token_budget < 1 or deadline_s <= 0 or not 0.0 <= min_score <= 1.0:
            raise ValueError("token_budget >= 1, deadline_s > 0 and min_score in 0..1")
        if flush_s is not None and flush_s <= 0:
            raise ValueError("flush_s must be positive (or None: no flush)")
        # a configuration error fails here, at start, not as a recall failure on every turn
        for s in scopes:
            Scope(s)
        for t in types:
            MemoryType(t)
        if context not in ("all", "session", "resources"):
            raise ValueError(f"context must be all, session or resources, not {context!r}")
        self.client = client
        self.top_k, self.token_budget, self.min_score = top_k, token_budget, min_score
        self.keep_degraded = keep_degraded
        self.deadline_s, self.flush_s = deadline_s, flush_s
        self.context, self.scopes, self.types = context, tuple(scopes), tuple(types)
        self.project = project
        self.gates = gates or GatePolicy()
        self.system_rule = system_rule
        self._audit = audit
        self._clock = clock
        self._states: OrderedDict[str, TopicState] = OrderedDict()
        # per session: the memories last recalled, and ``client.changes`` then
        self._cache: dict[str, tuple[int, tuple[RecalledMemory, ...]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._off: set[str] = set()  # sessions with memory switched off (``memory_off``)

    # --- the session's switch (seed 001: ``/memory off``) ----------------------------------

    async def memory_off(self, session: str) -> None:
        """Switch memory off for ``session``: from now on this middleware neither recalls,
        publishes the session's turns nor records its tool outcomes, and the workers store
        nothing from the session's turns that reach them (another process's). The switch
        holds here at once, even if telling the workers fails (which raises)."""
        self._off.add(session)
        self._cache.pop(session, None)
        await self.client.memory_off(session)

    async def memory_on(self, session: str) -> None:
        """Switch memory back on for ``session`` (raises if the workers cannot be told; it
        then stays off here too)."""
        await self.client.memory_on(session)
        self._off.discard(session)

    # --- before the model call --------------------------------------------------------------

    async def before_prompt(self, ctx: TurnContext) -> TurnContext:
        """The context to send to the model: the system rule, and the recalled memories
        (if the gates ask for them and they arrive within the deadline). A tool-loop step
        keeps the memories this turn's first step showed: the model still needs them half
        way through the turn. Never raises."""
        user_input = None if ctx.tool_only else ctx.user_input
        state = self._states.get(ctx.session, TopicState())
        now = self._clock()
        decision = decide(user_input, state, now, self.gates)
        if ctx.session in self._off:
            decision = Decision(False, "memory_off", state)
        changes = self.client.changes
        cached = self._cache.get(ctx.session)
        if decision.reason == "cache_fresh" and (cached is None or cached[0] != changes):
            # a memory was forgotten, changed or stored through this client since the recall:
            # the cached block could show what was forgotten; ask again
            decision = Decision(True, "cache_stale", fresh_state(user_input or ""))
        # a tool step's memory message was put there by this turn's first step; any other
        # turn's is replaced (or dropped) below
        step = decision.reason == "tool_only"
        base = ctx.messages if step else without_memory(ctx.messages)
        memories: tuple[RecalledMemory, ...] = ()
        if decision.recall and user_input is not None:
            memories, ok = await self._recall(ctx.session, user_input, decision)
            self._remember_state(ctx.session, recalled(decision.state, now, len(memories), ok))
            self._cache[ctx.session] = (changes, memories)
        else:
            if decision.reason != "tool_only":
                self._remember_state(ctx.session, decision.state)
            if decision.reason == "cache_fresh" and cached is not None:
                memories = cached[1]
            self._emit(
                "recall_skipped",
                ctx.session,
                reason=decision.reason,
                injected_count=len(memories),
            )
        messages = with_rule(base, self.system_rule)
        if memories:
            messages = inject(messages, reference(memories))
        return TurnContext(
            messages,
            session=ctx.session,
            turn_id=ctx.turn_id,
            started_at=ctx.started_at,
            recalled=ctx.recalled if step else memories,
            recall_reason=decision.reason,
            chat_id=ctx.chat_id,
        )

    async def _recall(
        self, session: str, query: str, decision: Decision
    ) -> tuple[tuple[RecalledMemory, ...], bool]:
        started = time.perf_counter()
        scope_meta = self._scope_meta()
        try:
            async with asyncio.timeout(self.deadline_s):
                reply = await self.client.recall(
                    # a pasted log or traceback can make a prompt longer than recall takes:
                    # its end (the error, the question) is what to recall for
                    query[-MAX_QUERY_CHARS:],
                    top_k=self.top_k,
                    session=session if self.context == "session" else None,
                    context=self.context,
                    scopes=list(self.scopes),
                    types=list(self.types),
                    project=self.project,
                    token_budget=self.token_budget,
                )
        except TimeoutError:
            self._emit("recall_failed", session, operation="recall", category="deadline")
            return (), False
        except MemoryClientError as exc:
            self._emit("recall_failed", session, operation="recall", category=_category(exc))
            return (), False
        except Exception:  # noqa: BLE001 (fail-open: a bug or a foreign error never reaches the agent)
            self._emit("recall_failed", session, operation="recall", category="internal")
            return (), False
        memories = self._select(reply.hits)
        self._emit(
            "recall_succeeded",
            session,
            reason=decision.reason,
            result_count=len(reply.hits),
            injected_count=len(memories),
            # what the injection adds to the prompt (seed 001's telemetry: added tokens)
            added_tokens=-(-len(reference(memories).content) // _CHARS_PER_TOKEN)
            if memories
            else 0,
            degraded=list(reply.degraded),
            elapsed_ms=round((time.perf_counter() - started) * 1000, 2),
            **scope_meta,
        )
        return memories, True

    def _select(self, hits: Sequence[Hit]) -> tuple[RecalledMemory, ...]:
        """Hits at or above ``min_score`` (calibrated; a hit without a calibrated score only
        with ``keep_degraded``), at most ``top_k``, and only as many as fit the token budget
        with the reference message's frame."""
        chosen: list[RecalledMemory] = []
        used = len(reference(()).content)
        for h in hits:
            score = h.calibrated
            if score is None and not self.keep_degraded:
                continue
            if score is not None and score < self.min_score:
                continue
            memory = RecalledMemory(h.id, h.text, h.type.value, score, h.session)
            cost = len(line(len(chosen) + 1, memory)) + 1
            if (used + cost) / _CHARS_PER_TOKEN > self.token_budget:
                continue
            used += cost
            chosen.append(memory)
            if len(chosen) == self.top_k:
                break
        return tuple(chosen)

    def _scope_meta(self) -> dict[str, AuditValue]:
        return {"context": self.context, "scopes": list(self.scopes) or ["owner"]}

    # --- after the model call ---------------------------------------------------------------

    async def after_prompt(self, ctx: TurnContext, out: ModelOutput | str) -> None:
        """Publish the current user input and the final answer (``wait=False``), then, in
        the background once the add succeeded, flush the session: returns at once, never
        raises. Nothing is published for a run that did not complete normally, for a
        non-final output (tool calls, unless ``final``; no text), or a context without user
        input."""
        try:
            output = ModelOutput(out) if isinstance(out, str) else out
            prompt = ctx.user_input
            intermediate = bool(output.tool_calls) and not output.final
            if not output.completed or intermediate or not output.content.strip():
                return
            if ctx.session in self._off:  # not even the raw turn leaves the agent
                return
            if prompt is None or not prompt.strip():
                return
            answered_at = datetime.now(UTC)
            user_at = min(ctx.started_at, answered_at)
            digest = hashlib.sha256(f"{prompt}\x1f{output.content}".encode()).hexdigest()
            # the owner is in the id: JetStream drops a repeated id across the tenant, so two
            # users with the same session name, turn id and texts ("hi" -> "Hello!") would
            # otherwise store one turn between them, the other acked as a duplicate
            who = "\x1f".join(x or "" for x in (self.client.user, self.client.agent))
            event_id = str(
                uuid.uuid5(
                    uuid.NAMESPACE_URL, f"{who}\x1f{ctx.session}\x1f{ctx.turn_id}\x1f{digest}"
                )
            )
            messages = [
                {"role": "user", "content": prompt, "timestamp": user_at},
                {"role": "assistant", "content": output.content, "timestamp": answered_at},
            ]
            meta: dict[str, AuditValue] = {"message_count": 2, "kind": "turn"}
            added: asyncio.Future[tuple[PublishResult | None, BaseException | None]]
            added = asyncio.get_running_loop().create_future()

            def settle(res: PublishResult | None, err: BaseException | None) -> None:
                if not added.done():
                    added.set_result((res, err))

            await self.client.publish_turn(
                messages,
                wait=False,
                session=ctx.session,
                event_id=event_id,
                project=self.project,
                occurred_at=answered_at,
                on_done=settle,
            )
            self._spawn(self._after_add(ctx.session, added, meta))
        except (ValidationError, ValueError, TypeError):
            self._emit(
                "add_failed", ctx.session, operation="add", category="bad_request", kind="turn"
            )
        except Exception:  # noqa: BLE001 (fail-open)
            self._emit("add_failed", ctx.session, operation="add", category="internal")

    async def _after_add(
        self,
        session: str,
        added: asyncio.Future[tuple[PublishResult | None, BaseException | None]],
        meta: Mapping[str, AuditValue],
    ) -> None:
        """Audit the add's outcome (the client retries it in the background), then flush the
        session once if it succeeded."""
        try:
            # the client's retries (3 tries of publish_timeout) end well before this
            # the client tries a publish for ``retry_for_s`` while NATS is away
            wait_s = getattr(self.client, "retry_for_s", 60.0) + _ADD_WAIT_S
            async with asyncio.timeout(wait_s):
                result, error = await added
        except TimeoutError as exc:
            result, error = None, exc
        if error is not None or result is None:
            self._emit(
                "add_failed",
                session,
                operation="add",
                category=_category(error) if error else "internal",
                kind=str(meta.get("kind")),
            )
            return
        self._emit("add_succeeded", session, duplicate=result.duplicate, **meta)
        if self.flush_s is not None:
            await self._flush(session, self.flush_s)

    async def _flush(self, session: str, within_s: float) -> None:
        """One flush of ``session``, at most ``within_s`` (plus the last progress read):
        ``flush_succeeded`` says whether it was ``flushed`` or still ``pending`` (as the
        gateway's 200 and 202 do); a flush that could not be done is ``flush_failed``."""
        failed: dict[str, AuditValue] = {"operation": "flush", "add_succeeded": True}
        if self.client.closed:
            self._emit("flush_failed", session, category="closed", **failed)
            return
        try:
            # a progress read that hangs on a half-open connection must not outlive the bound
            async with asyncio.timeout(within_s + 1.0):
                done = await self.client.flush(session, within_s=within_s)
        except TimeoutError:
            self._emit("flush_failed", session, category="deadline", **failed)
        except MemoryClientError as exc:
            category = "closed" if self.client.closed else _category(exc)
            self._emit("flush_failed", session, category=category, **failed)
        except Exception:  # noqa: BLE001 (fail-open: a flush never reaches the agent)
            self._emit("flush_failed", session, category="internal", **failed)
        else:
            self._emit("flush_succeeded", session, status="flushed" if done else "pending")

    # --- verified tool outcomes ---------------------------------------------------------------

    async def on_tool_result(self, ctx: TurnContext, outcome: ToolOutcome) -> None:
        """Record a verified outcome as a ``fix`` or ``lesson_learned`` memory, in the
        background (``drain`` waits for it). Unverified outcomes are not recorded."""
        if not outcome.verified or not outcome.summary.strip() or ctx.session in self._off:
            return
        self._spawn(self._record(ctx.session, outcome))

    async def _record(self, session: str, outcome: ToolOutcome) -> None:
        try:
            scope = "project" if self.project else "user"
            await self.client.remember(
                outcome.summary,
                type=outcome.kind,
                scope=scope,
                session=session,
                project=self.project,
                metadata={"source": "tool_result", "tool": outcome.tool},
            )
        except MemoryClientError as exc:
            self._emit(
                "add_failed",
                session,
                operation="remember",
                category=_category(exc),
                kind=outcome.kind,
            )
            return
        except Exception:  # noqa: BLE001 (fail-open)
            self._emit(
                "add_failed",
                session,
                operation="remember",
                category="internal",
                kind=outcome.kind,
            )
            return
        self._emit("add_succeeded", session, kind=outcome.kind, message_count=1)

    async def drain(self, within_s: float = 10.0) -> None:
        """Wait (bounded) for the middleware's background writes and flushes; call it before
        closing the client (a flush still waiting then stops as ``closed``)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=within_s)

    # --- helpers --------------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remember_state(self, session: str, state: TopicState) -> None:
        self._states[session] = state
        self._states.move_to_end(session)
        while len(self._states) > _MAX_SESSIONS:
            old, _ = self._states.popitem(last=False)
            self._cache.pop(old, None)

    def _emit(self, name: AuditName, session: str, **metadata: AuditValue) -> None:
        if self._audit is None:
            return
        try:
            self._audit(AuditEvent(name, session, dict(metadata)))
        except Exception:  # noqa: BLE001 (an audit sink that fails must not fail the agent's turn)
            return


def _category(exc: BaseException) -> str:
    """An error category safe for audit metadata: the service's code, or the class."""
    code = getattr(exc, "code", None)
    if isinstance(code, ErrorCode):
        return code.value
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, MemoryClientError):
        return "unavailable" if "connect" in str(exc) else "publish_failed"
    return "internal"
