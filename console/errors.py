"""``ConsoleError``, the one error the console raises.

Separate from ``backend.py`` because ``dead_letters.py``, which the backend mixes in, and the web
pages raise it too: on its own, every module imports it one way, none from another's importer.
"""


class ConsoleError(Exception):
    """An action or a query failed; the message is safe to show (no value, no address)."""
