"""Which stages a worker process hands on in memory: the run of consecutive stages it runs
from each one (consumers/chains.chain_of); and the worker process's GC settings."""

from __future__ import annotations

import subprocess
import sys

from memstream.consumers.batch_stages import BATCH_STAGES
from memstream.consumers.chains import batch_stage, chain_of
from memstream.schemas.subjects import STAGES


def test_every_stage_chains_through_store_in_a_process_running_all() -> None:
    """With every stage, each one is fused through store."""
    assert chain_of(STAGES, [*STAGES, "recall"]) == {
        "extract": ("extract", "redact", "dedupe", "store"),
        "redact": ("redact", "dedupe", "store"),
        "dedupe": ("dedupe", "store"),
        "store": ("store",),
    }


def test_the_deployed_roles_chain_within_each_process() -> None:
    """An extract+redact process fuses the two and hands on to dedupe's subject; the index
    owner fuses dedupe into store; a gap breaks the chain."""
    assert chain_of(STAGES, ["extract", "redact"]) == {
        "extract": ("extract", "redact"),
        "redact": ("redact",),
    }
    assert chain_of(STAGES, ["dedupe", "store", "recall"]) == {
        "dedupe": ("dedupe", "store"),
        "store": ("store",),
    }
    assert chain_of(STAGES, ["extract", "dedupe"]) == {
        "extract": ("extract",),
        "dedupe": ("dedupe",),
    }


def test_a_chain_of_one_is_the_plain_batch_stage() -> None:
    """A stage with nothing to fuse keeps its plain batch work; a longer chain keeps the
    stage's decoding and its single path, with fused work."""
    assert batch_stage(("store",)) is BATCH_STAGES["store"]
    fused = batch_stage(("redact", "dedupe"))
    plain = BATCH_STAGES["redact"]
    assert fused.decode is plain.decode and fused.single is plain.single
    assert fused.work is not plain.work


def test_a_worker_process_freezes_its_startup_heap_and_collects_less_often() -> None:
    """``quieter_gc`` (called when a worker starts) moves what is alive out of every later
    collection and raises the youngest generation's threshold, in a fresh process."""
    code = (
        "import gc\n"
        "import memstream.consumers.app  # what a worker has loaded\n"
        "from memstream.consumers.quietgc import quieter_gc\n"
        "before = (gc.get_freeze_count(), gc.get_threshold()[0])\n"
        "quieter_gc()\n"
        "print(before, (gc.get_freeze_count() > 10_000, gc.get_threshold()[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(0, 700) (True, 50000)"
