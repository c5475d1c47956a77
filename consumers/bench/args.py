"""Argument types the benchmarks share."""

from __future__ import annotations

import argparse
from pathlib import Path


def data_file(text: str) -> Path:
    """An argparse type: a benchmark's data file, which must exist (a clear usage error, not
    a traceback, when it does not: the data lives in the shared folder beside the checkout)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"no such file: {text} (the benchmark data is in ../shared/bench/ beside the "
            "project folder; pass its path)"
        )
    return path
