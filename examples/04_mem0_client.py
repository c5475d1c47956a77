"""Mem0's own client against memstream: only `host` changes (docs/integrations.md).

    make run                                                      # terminal 1
    export MEM0_API_KEY=$(.venv/bin/memstream keys create --tenant default --user alice | tail -n1)
    MEM0_TELEMETRY=False .venv/bin/python examples/04_mem0_client.py

The host is MEMSTREAM_GATEWAY_URL, else the gateway `make run` recorded in .memstream/stack.json.
The key is a memstream key (here bound to user alice), sent as `Authorization: Token <key>`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported

from mem0 import MemoryClient


def gateway_url() -> str:
    if url := os.environ.get("MEMSTREAM_GATEWAY_URL"):
        return url
    stack = Path(os.environ.get("MEMSTREAM_STATE_DIR", ".memstream")) / "stack.json"
    return str(json.loads(stack.read_text())["gateway_url"])


def main() -> None:
    client = MemoryClient(api_key=os.environ["MEM0_API_KEY"], host=gateway_url())
    added = client.add("I prefer window seats on long flights", user_id="alice")
    print("add:", added["status"], "event", added["event_id"][:8])

    # add is asynchronous (as on Mem0's platform): poll until the memory is searchable
    deadline = time.monotonic() + 30
    while True:
        hits = client.search("which seat does alice like?", filters={"user_id": "alice"})
        hits = [h for h in hits["results"] if "window" in h["memory"]]
        if hits or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not hits:
        raise SystemExit("the memory did not become searchable within 30 s")
    memory_id = hits[0]["id"]
    print(f"search: {hits[0]['memory']!r} score {hits[0]['score']:.2f}")

    client.update(memory_id, text="I prefer aisle seats on long flights")
    print("get after update:", repr(client.get(memory_id)["memory"]))
    print("history:", [h["event"] for h in client.history(memory_id)])
    client.delete(memory_id)
    print(
        "after delete:",
        memory_id not in [m["id"] for m in client.get_all(filters={"user_id": "alice"})["results"]],
    )


if __name__ == "__main__":
    main()
