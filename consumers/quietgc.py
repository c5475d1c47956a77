"""Fewer, cheaper garbage collections for the processes that run the stages: the worker,
its index process and its helper.

What is alive once a process is built (modules, the model, the rules) is frozen out of every
collection, and a collection of the youngest objects waits for 50,000 allocations instead of
700: a stage batch allocates that many in a few milliseconds, and collections walking the
long-lived heap were a tenth of the worker's CPU and the worst of recall's tail
(docs/benchmarks.md, 2026-11-25, "fused stages"), and a fifth of the helper's busy samples
(docs/benchmarks.md, "twentieth session").
"""

from __future__ import annotations

import gc


def quieter_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
