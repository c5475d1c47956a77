"""Commands that refuse to start: an invalid MEMSTREAM_* variable (one clear line per variable),
a missing or public redaction key; exit code 2, no traceback, and never the value (it may be a
secret). Each runs the real `memstream` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def test_invalid_settings_are_named_without_their_values(tmp_path: Path) -> None:
    """Four bad variables: each named with its problem, none echoed, nothing started."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path),
        "MEMSTREAM_CPU_LATENCY_US": "-1",
        "MEMSTREAM_HNSW_EF": "hunter2-secret",
        "MEMSTREAM_STAGE__BATCH_SIZE": "0",
        "MEMSTREAM_EVENT_LOOP": "trio",
    }
    done = subprocess.run(
        [MEMSTREAM, "dev"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    err = done.stderr
    assert err.startswith("memstream: invalid configuration:")
    assert "MEMSTREAM_CPU_LATENCY_US: Input should be greater than or equal to 0" in err
    assert "MEMSTREAM_HNSW_EF: Input should be a valid integer" in err
    assert "MEMSTREAM_STAGE__BATCH_SIZE: Input should be greater than or equal to 1" in err
    assert "MEMSTREAM_EVENT_LOOP: Input should be 'uvloop' or 'asyncio'" in err
    assert "hunter2" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was started in the state directory


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["recall", "--cpu-latency-us", "-1"], "--cpu-latency-us: must be 0 or more µs, not -1"),
        (["ingest", "--pg-statements", "-1"], "--pg-statements: must be 0 or more, not -1"),
    ],
    ids=["latency", "statements"],
)
def test_the_bench_refuses_a_negative_count(args: list[str], says: str) -> None:
    """A negative count is refused at parse time with what the option takes, exit 2 and no
    traceback, before anything starts."""
    done = subprocess.run(
        [MEMSTREAM, "bench", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path / "state"),
        # unreachable services: a worker that got past the key check would fail differently
        "MEMSTREAM_NATS_URL": "nats://127.0.0.1:9",
        "MEMSTREAM_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/x",
        **extra,
    }


def test_worker_refuses_to_start_without_a_redaction_key(tmp_path: Path) -> None:
    """No MEMSTREAM_REDACTION_KEY: exit 2 with a sentence naming the variable and the flag."""
    done = subprocess.run(
        [MEMSTREAM, "worker"], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("memstream: MEMSTREAM_REDACTION_KEY is not set")
    assert "--dev-redaction-key" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was started


@pytest.mark.parametrize("key", ["memstream-dev-redaction-key", "change-me", "short-secret-1"])
def test_worker_refuses_a_public_or_short_key_without_printing_it(tmp_path: Path, key: str) -> None:
    """The old public default, the compose example and a short key are refused, unprinted."""
    env = _env(tmp_path, MEMSTREAM_REDACTION_KEY=key)
    done = subprocess.run(
        [MEMSTREAM, "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "MEMSTREAM_REDACTION_KEY" in done.stderr
    assert key not in done.stderr + done.stdout
