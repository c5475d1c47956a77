"""The gateway's logger (stdlib logging: the gateway carries no worker dependencies).

Log lines name routes, codes and counts: never a key, a request body or memory content."""

from __future__ import annotations

import logging

log = logging.getLogger("memstream.gateway")
