"""The stack file (schemas/stack.py): one module writes and reads it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from memstream.producers.client import discover_nats_url
from memstream.schemas.stack import read_stack, remove_stack, stack_path, write_stack


def test_written_owner_only_read_back_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is replaced whole, readable by its owner only, and read back as written."""
    monkeypatch.delenv("MEMSTREAM_NATS_URL", raising=False)
    write_stack(tmp_path, {"nats_url": "nats://127.0.0.1:1"})
    write_stack(tmp_path, {"nats_url": "nats://127.0.0.1:2", "namespace": "mem"})
    assert read_stack(tmp_path) == {"nats_url": "nats://127.0.0.1:2", "namespace": "mem"}
    assert stat.S_IMODE(stack_path(tmp_path).stat().st_mode) == 0o600
    assert discover_nats_url(tmp_path) == "nats://127.0.0.1:2"
    remove_stack(tmp_path)
    remove_stack(tmp_path)  # twice is harmless
    assert read_stack(tmp_path) == {}


def test_a_missing_or_foreign_file_reads_as_no_stack(tmp_path: Path) -> None:
    """No file, a file that is not JSON, or JSON that is not an object: no stack."""
    assert read_stack(tmp_path / "nowhere") == {}
    stack_path(tmp_path).write_text("not json")
    assert read_stack(tmp_path) == {}
    stack_path(tmp_path).write_text("[1, 2]")
    assert read_stack(tmp_path) == {}
