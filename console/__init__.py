"""The operator's web console: Overview, Dead letters, Memories, Events.

    backend = await ConsoleBackend.connect(settings, nats_url)  # or (settings, nc, redactor)
    app = create_app(backend, token)  # an ASGI app: mount it at /console

It is a NATS client of the workers (JetStream info, ``<ns>.ops.stats``, ``mem.recall``,
``mem.cmd.*``, the dead-letter and event streams): the worker serves it on its console port,
the gateway mounts the same app.
"""

from memstream.console.backend import Caller, ConsoleBackend
from memstream.console.errors import ConsoleError
from memstream.console.server import ConsoleServer, serve
from memstream.console.web import create_app, standalone

__all__ = [
    "Caller",
    "ConsoleBackend",
    "ConsoleError",
    "ConsoleServer",
    "create_app",
    "serve",
    "standalone",
]
