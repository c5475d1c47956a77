"""The faults bench's plan: when each fault is due, and how far the publisher may run ahead of
it, so that a fault the pipeline works through does not leave the next one with no work."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memstream.consumers.bench.fault_plan import Gate, due_share, in_hand, inject_plan
from memstream.consumers.bench.publisher import Progress, Publisher


def test_faults_are_due_at_rising_shares_short_of_the_end() -> None:
    """Fault k of m is due once (k + 1) / (m + 1.5) of the turns are stored: in order, and the
    last one still before the end, so turns remain to be stored after it."""
    shares = [due_share(k, 7) for k in range(7)]
    assert shares == sorted(shares) and shares[0] > 0 and shares[-1] < 0.9


def test_the_gate_holds_the_publisher_near_the_next_fault_until_it_is_made() -> None:
    """Until fault k is made, at most ``ahead`` turns past its due share may be published; once
    made, the limit moves to the next fault's; after the last, every turn; never more than
    there are."""
    gate = Gate(turns=3000, faults=7, ahead=300)
    assert gate.limit() == int(due_share(0, 7) * 3000) + 300
    gate.made = 4  # e.g. the index taken away for 5 s: the pipeline still stores meanwhile
    assert gate.limit() == int(due_share(4, 7) * 3000) + 300
    assert gate.limit() < 3000 - 300  # so the fifth fault meets turns that are not stored yet
    gate.made = 7
    assert gate.limit() == 3000
    assert Gate(turns=300, faults=1, ahead=1000).limit() == 300


def test_the_publisher_waits_for_what_is_stored_and_for_the_limit() -> None:
    """A publish waits while ``ahead`` turns are published beyond those stored, and while the
    limit is reached; otherwise it goes."""
    progress = Progress()
    limit = [10]
    p = Publisher({}, progress, ahead=5, limit=lambda: limit[0])
    p.acked.update(f"e{i}" for i in range(4))
    assert not p.held()
    p.acked.update(f"e{i}" for i in range(4, 5))
    assert p.held()  # 5 published, none stored
    progress.events = 5
    assert not p.held()
    p.acked.update(f"e{i}" for i in range(5, 10))
    progress.events = 9
    assert p.held()  # the limit: 10 published
    limit[0] = 20
    assert not p.held()
    assert not Publisher({}, progress, ahead=5).held()


class Failing:
    """A fleet whose every fault fails to be made (a server that would not start again)."""

    extras: list[object] = []

    async def inject(self, fault: str) -> float:
        raise RuntimeError(f"{fault} failed")


def _plan(progress: Progress, gate: Gate, stall_limit_s: float) -> list[dict[str, Any]]:
    publisher = Publisher({}, progress, ahead=gate.ahead, limit=gate.limit)
    publisher.acked.update(f"e{i}" for i in range(progress.events))  # stored: published
    fleet: Any = Failing()
    watch: Any = None  # no extra process in this plan: never asked
    faults = ["worker_kill", "nats_kill"]

    async def stored_now() -> int | None:
        return None  # Postgres cannot be read: the monitor's count stands

    run = inject_plan(
        fleet, faults, progress, publisher, gate, stall_limit_s, 0.0, watch, stored_now
    )
    return asyncio.run(run)


def test_a_plan_that_ends_early_opens_the_gate_for_every_turn() -> None:
    """A plan stopped by a stall (nothing stored for longer than the limit), or by a fault
    that fails, no longer holds the publisher: it may publish every turn, and the report
    counts what was lost instead of the run hanging."""
    gate = Gate(turns=3000, faults=2, ahead=300)
    assert gate.limit() < 3000
    assert _plan(Progress(seen_at=0.0), gate, 0.0) == []  # nothing stored since long ago
    assert gate.limit() == 3000
    gate = Gate(turns=3000, faults=2, ahead=300)
    with pytest.raises(RuntimeError, match="worker_kill failed"):
        _plan(Progress(events=3000), gate, 60.0)  # the first fault is due at once, and fails
    assert gate.limit() == 3000


def test_a_fault_due_with_nothing_in_flight_waits_for_a_turn_let_past_the_gate() -> None:
    """The pipeline stored every turn the gate let out before the fault was read as due: the
    gate lets ``ahead`` more out, and the fault waits until a quarter of ``ahead`` are
    published and not stored, then reports them in flight. With every turn published and
    stored it goes at once, with none in flight."""

    async def scenario() -> tuple[tuple[int, int], int, tuple[int, int]]:
        gate = Gate(turns=3000, faults=7, ahead=300)
        progress = Progress(events=gate.limit())  # all of them stored
        publisher = Publisher({}, progress, ahead=300, limit=gate.limit)
        publisher.acked.update(f"e{i}" for i in range(gate.limit()))
        stored = [gate.limit()]

        async def stored_now() -> int | None:
            return stored[0]

        async def publish_one() -> None:
            await progress.changed.wait()  # woken by the gate opening
            for i in range(75):  # a quarter of ``ahead``
                assert not publisher.held()
                publisher.acked.add(f"next{i}")
                await asyncio.sleep(0)

        publishing = asyncio.create_task(publish_one())
        found = await in_hand(stored_now, publisher, gate, wait_s=5.0)
        await publishing
        opened = gate.limit()
        stored[0] = len(publisher.acked)
        everything = Gate(turns=len(publisher.acked), faults=7, ahead=300)
        at_end = await in_hand(stored_now, publisher, everything, wait_s=5.0)
        return found, opened, at_end

    due = int(due_share(0, 7) * 3000)
    found, opened, at_end = asyncio.run(scenario())
    assert found == (due + 300, 75)
    assert opened == due + 600
    assert at_end == (due + 375, 0)
