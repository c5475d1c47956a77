"""What a statement costs PostgreSQL, for tests that hold a query to an index's reach."""

from __future__ import annotations

import json
from typing import Any


async def buffers(con: Any, sql: str, *args: Any) -> int:
    """Shared buffers ``sql`` touched (hit or read), run under EXPLAIN (ANALYZE, BUFFERS):
    the work a statement does, whatever the machine's speed."""
    plan = json.loads(await con.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args))
    top: dict[str, int] = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]
