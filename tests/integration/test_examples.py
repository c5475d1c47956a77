"""The runnable files in examples/ (01, 02, 05), each run as a user would run it, against
the real stack the worker fixture serves."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def run_example(running, name: str, tmp_path: Path) -> str:
    """Run ``examples/<name>`` in its own process, pointed at the test's NATS and namespace;
    its output, after checking it exited 0 (within two minutes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env |= {
        "MEMSTREAM_NATS_URL": running.nats_url,
        "MEMSTREAM_NAMESPACE": running.settings.namespace,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    print(text)  # shown by pytest -s, and on failure
    assert proc.returncode == 0, text
    return text


async def test_01_publish_and_recall(running, tmp_path: Path) -> None:
    """Example 01 publishes a turn, waits for it, and recalls it first."""
    out = await run_example(running, "01_publish_and_recall.py", tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("published turn ") and lines[1] == "processed"
    assert "hit(s) for 'where is my bike?'" in lines[2]
    assert "My bike is locked in the garage behind the house" in lines[3]


async def test_02_middleware_chat_loop(running, tmp_path: Path) -> None:
    """Example 02: the first turn recalls at session start, the acknowledgement skips, and
    the third turn answers from the memory the first one left."""
    out = await run_example(running, "02_middleware_chat_loop.py", tmp_path)
    assert "recall: session_start, 0 memory(ies) injected" in out
    assert "recall: acknowledgement, 0 memory(ies) injected" in out
    assert "audit: add_succeeded" in out and "audit: recall_failed" not in out
    last = [line for line in out.splitlines() if line.startswith("assistant: ")][-1]
    assert last.startswith("assistant: From what I remember: ")
    assert "blue green rollouts" in last


async def test_05_langgraph_store(running, tmp_path: Path) -> None:
    """Example 05: a compiled graph stores a memory in MemstreamStore and finds it."""
    out = await run_example(running, "05_langgraph_store.py", tmp_path)
    assert "graph: Noted." in out
    assert "graph: You told me: my cat sleeps on the blue sofa (score " in out
    assert "namespaces: [('users', 'carol', 'memories')]" in out
