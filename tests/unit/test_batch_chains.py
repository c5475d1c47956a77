"""Which stages a worker process hands on in memory: the run of consecutive stages it runs
from each one (consumers/batch_stages.chain_of)."""

from __future__ import annotations

from memstream.consumers.batch_stages import BATCH_STAGES, batch_stage, chain_of
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
