"""The recall benchmark's memories: one-line episodes drawn from a fixed vocabulary, and
``load``, which writes a tenant's worth of them straight into the stores (Postgres rows and
vector points, as the store stage writes them).

Separate from ``recall.py``, which measures recall over NATS, because this is what is
measured against, not the measurement; ``recall.py`` draws its queries from the same ``WORDS``
so that they find something.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from memstream.consumers import indexing
from memstream.consumers.bench.harness import progress
from memstream.pipeline import dedupe
from memstream.schemas.memory import Candidate, MemoryType, Owner
from memstream.storage.postgres import OwnerFilter

WORDS = [
    "alpha",
    "amber",
    "anchor",
    "apple",
    "arrow",
    "autumn",
    "badge",
    "bamboo",
    "banjo",
    "basil",
    "beacon",
    "berry",
    "bicycle",
    "blossom",
    "breeze",
    "bridge",
    "bronze",
    "cabin",
    "cactus",
    "camera",
    "canal",
    "candle",
    "canyon",
    "carbon",
    "castle",
    "cedar",
    "cello",
    "chalk",
    "cherry",
    "cinema",
    "citrus",
    "cliff",
    "clover",
    "cobalt",
    "comet",
    "copper",
    "coral",
    "cotton",
    "crane",
    "crystal",
    "daisy",
    "delta",
    "desert",
    "dolphin",
    "dragon",
    "drum",
    "eagle",
    "ember",
    "falcon",
    "fern",
    "fiddle",
    "forest",
    "fossil",
    "galaxy",
    "garden",
    "garnet",
    "ginger",
    "glacier",
    "granite",
    "harbor",
    "hazel",
    "helmet",
    "honey",
    "island",
    "ivory",
    "jasmine",
    "jungle",
    "kettle",
    "kiwi",
    "lagoon",
    "lantern",
    "lemon",
    "lilac",
    "lotus",
    "magnet",
    "maple",
    "marble",
    "meadow",
    "meteor",
    "mint",
    "mirror",
    "monsoon",
    "mosaic",
    "nectar",
    "nickel",
    "oasis",
    "olive",
    "onyx",
    "orchid",
    "otter",
    "paddle",
    "panda",
    "pepper",
    "pillow",
    "pine",
    "planet",
    "plum",
    "prairie",
    "quartz",
    "quill",
    "raven",
    "reef",
    "ribbon",
    "river",
    "rocket",
    "saffron",
    "salmon",
    "sapphire",
    "scarlet",
    "shadow",
    "silver",
    "spruce",
    "summit",
    "thistle",
    "thunder",
    "tiger",
    "timber",
    "topaz",
    "tulip",
    "tundra",
    "velvet",
    "violet",
    "walnut",
    "willow",
    "zephyr",
]
VERBS = (
    "likes",
    "bought",
    "visited",
    "painted",
    "lost",
    "found",
    "wants",
    "planned",
    "fixed",
    "shared",
    "borrowed",
    "cooked",
    "measured",
    "photographed",
    "repaired",
    "sold",
)


def sentence(rng: random.Random) -> str:
    a, b, c = rng.sample(WORDS, 3)
    return f"The user {rng.choice(VERBS)} the {a} {b} near the {c} on day {rng.randint(1, 999)}."


async def load(bench: Any, tenant: str, n: int, rng: random.Random, label: str) -> None:
    started = time.perf_counter()
    embedder, pg, vectors = bench.worker.embedder, bench.stack.pg, bench.worker.vectors
    base = datetime(2025, 1, 1, tzinfo=UTC)
    for offset in range(0, n, 2000):
        cands = [
            Candidate(
                candidate_id=f"{tenant}-{i}",
                owner=Owner(tenant=tenant, user="u0"),
                session=f"s{i % 50}",
                type=MemoryType.EPISODE,
                content=sentence(rng),
                source_event_id=f"{tenant}-e{i}",
                occurred_at=base + timedelta(minutes=i),
                redacted=True,
            )
            for i in range(offset, min(n, offset + 2000))
        ]
        keyed = [dedupe.key(c) for c in cands]
        await pg.bulk_insert([(k.memory_id, k.content_hash, k.candidate) for k in keyed])
        rows = await pg.get_many(OwnerFilter(tenant=tenant), [k.memory_id for k in keyed])
        await indexing.index(pg, vectors, embedder, [rows[k.memory_id] for k in keyed])
        progress(label, min(n, offset + 2000), n, started)
