"""Publish a conversation turn, wait until the pipeline has processed it, and recall it.

    make run                                            # in one terminal: the whole stack
    .venv/bin/python examples/01_publish_and_recall.py  # in another, from the repository

The SDK finds `make run`'s NATS through .memstream/stack.json; elsewhere set
MEMSTREAM_NATS_URL.
"""

from __future__ import annotations

import asyncio

from memstream.producers import MemoryClient

SESSION = "example-01"


async def main() -> None:
    async with MemoryClient("default", user="alice") as mem:
        published = await mem.publish_turn(
            [
                ("user", "My bike is locked in the garage behind the house"),
                ("assistant", "Noted: the bike is in the garage."),
            ],
            session=SESSION,
        )
        assert published is not None
        print(f"published turn {published.event_id} (stream seq {published.seq})")

        # the pipeline is asynchronous: wait until the turn is recallable
        done = await mem.flush(SESSION, within_s=30)
        print("processed" if done else "still processing after 30 s")

        reply = await mem.recall("where is my bike?", top_k=3)
        print(f"{len(reply.hits)} hit(s) for 'where is my bike?':")
        for hit in reply.hits:
            score = hit.calibrated if hit.calibrated is not None else hit.score
            print(f"  {score:.2f}  {hit.type.value:<10} {hit.text}")


if __name__ == "__main__":
    asyncio.run(main())
