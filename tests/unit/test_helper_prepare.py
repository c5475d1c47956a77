"""What the helper process computes (consumers/helper.py, ``prepare``) is what the in-process
stages compute for the same turns, and which workers get a helper."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from memstream.consumers import helper
from memstream.consumers.helper import prepare
from memstream.consumers.redaction_key import make_redactor
from memstream.consumers.stages import embedded, redact_candidate
from memstream.pipeline.extract import extract
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.embedding import make_embedder


def turns() -> list[TurnEvent]:
    return [
        TurnEvent(
            tenant="acme",
            user="bo",
            session="s1",
            messages=[
                Message(role=Role.USER, content="I prefer tea. My email is bo@example.com."),
                Message(role=Role.ASSISTANT, content="Noted, tea it is."),
            ],
        ),
        TurnEvent(
            tenant="acme", user="bo", session="s1", messages=[Message(role=Role.USER, content="ok")]
        ),
        TurnEvent(
            tenant="beta",
            agent="a1",
            session="s2",
            messages=[
                Message(
                    role=Role.USER, content="We decided to ship on Friday, call +1 202-555-0143."
                )
            ],
        ),
    ]


def test_prepare_matches_the_in_process_stages() -> None:
    """Three turns: the helper's candidates are, turn by turn, those extract, redact and the
    embedding make in process (redacted, each with its vector), and survive pickling."""
    redactor, embedder = make_redactor(Settings(), b"k" * 32), make_embedder(None, None)
    events = turns()
    done = prepare(events, redactor, embedder)
    expected = [
        embedded(embedder, [redact_candidate(redactor, c) for c in extract(e)]) for e in events
    ]
    # the same candidates; a vector made in a batch differs from one made alone by float
    # rounding only (the static model sums a batch's token rows in one matrix product)
    assert [[c.model_copy(update={"vector": None}) for c in cs] for cs in done.candidates] == [
        [c.model_copy(update={"vector": None}) for c in cs] for cs in expected
    ]
    for got, want in zip(done.candidates, expected, strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.vector is not None and w.vector is not None
            assert g.vector == pytest.approx(w.vector, abs=1e-6)
    flat = [c for cs in done.candidates for c in cs]
    assert all(c.redacted and c.vector is not None for c in flat)
    assert not any("bo@example.com" in c.content or "555-0143" in c.content for c in flat)
    assert done.extract_s > 0 and done.redact_s > 0
    # what crosses the process boundary comes back whole
    assert pickle.loads(pickle.dumps(done)).candidates == done.candidates


@pytest.mark.parametrize(
    ("changes", "cpus", "wanted"),
    [
        ({}, 2, True),
        ({}, 1, False),
        ({"stage": StageSettings(helper=False)}, 2, False),
        ({"stage": StageSettings(fused=False)}, 2, False),
        ({"stage": StageSettings(batched=False)}, 2, False),
        ({"stages": ("dedupe", "store", "recall")}, 2, False),
        ({"stages": ("extract", "redact")}, 2, True),
    ],
)
def test_which_workers_get_a_helper(monkeypatch, changes, cpus, wanted) -> None:
    """A helper for a batched, fused worker running extract and redact on two or more CPUs;
    none with one CPU, with the helper, batches or fusing off, or for the index owner alone."""
    monkeypatch.setattr(helper, "usable_cpus", lambda: cpus)
    assert helper.wanted(Settings(**changes)) is wanted


def test_the_llm_extractor_keeps_extraction_in_the_worker(monkeypatch) -> None:
    """With the LLM extractor (it calls out from the worker) there is no helper."""
    monkeypatch.setattr(helper, "usable_cpus", lambda: 2)
    settings = Settings.model_validate(
        {"extractor": "rules+llm", "llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    )
    assert not helper.wanted(settings)


def test_usable_cpus_follow_the_affinity(monkeypatch) -> None:
    """A process pinned to one CPU counts one, however many the host has."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {3})
    assert helper.usable_cpus() == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert 1 <= helper.usable_cpus() <= 4


def test_the_helper_process_collects_garbage_as_a_worker_does() -> None:
    """The helper's main (``_child``), run as a spawned child runs it, has frozen its start-up
    heap and raised the youngest generation's threshold by the time it answers ready: with
    the interpreter's defaults, collections were a fifth of its busy samples."""
    code = (
        "import gc, pickle, threading\n"
        "from multiprocessing import Pipe\n"
        "from memstream.consumers import helper\n"
        "from memstream.schemas.settings import Settings\n"
        "work_in, work_out = Pipe(duplex=False)\n"
        "answers_in, answers_out = Pipe(duplex=False)\n"
        "def watch():\n"
        "    kind = pickle.loads(answers_in.recv_bytes())[0]\n"
        "    print(kind, gc.get_threshold()[0], gc.get_freeze_count() > 10_000, flush=True)\n"
        "    work_out.close()  # the child reads EOF and returns\n"
        "threading.Thread(target=watch).start()\n"
        "helper._child(work_in, answers_out, Settings(), b'k' * 32)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["ready", "50000", "True"]
