"""Benchmark options refuse values that cannot mean anything, with a message naming them."""

from __future__ import annotations

import argparse

import pytest

from memstream.consumers.bench import ingest


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memstream bench ingest", exit_on_error=False)
    ingest.add_arguments(p)
    return p


def test_recall_rate_takes_zero_or_a_positive_rate() -> None:
    """0 (back to back) and a positive rate are taken as given."""
    assert parser().parse_args([]).recall_rate == 0.0
    assert parser().parse_args(["--recall-rate", "250"]).recall_rate == 250.0


@pytest.mark.parametrize("value", ["-3", "nan", "fast"])
def test_recall_rate_refuses_a_negative_or_unreadable_rate(value: str) -> None:
    """A negative rate, nan or a word is an argument error, not a silent back-to-back run."""
    with pytest.raises(argparse.ArgumentError, match="--recall-rate"):
        parser().parse_args(["--recall-rate", value])
