"""An invalid MEMSTREAM_* variable stops a command with one clear line per variable and exit
code 2: no traceback, and never the value (it may be a secret)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def test_invalid_settings_are_named_without_their_values(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path),
        "MEMSTREAM_CPU_LATENCY_US": "-1",
        "MEMSTREAM_HNSW_EF": "hunter2-secret",
        "MEMSTREAM_STAGE__BATCH_SIZE": "0",
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
    assert "hunter2" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was started in the state directory


def test_the_bench_refuses_a_negative_latency() -> None:
    done = subprocess.run(
        [MEMSTREAM, "bench", "recall", "--cpu-latency-us", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--cpu-latency-us: must be 0 or more µs, not -1" in done.stderr
