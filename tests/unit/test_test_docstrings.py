"""The house rule that every test states what it proves, kept by a test."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_has_a_docstring() -> None:
    """Each test function under tests/ (sync or async) opens with a non-empty docstring."""
    missing = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("test") and not (ast.get_docstring(node) or "").strip():
                missing.append(f"{path.relative_to(TESTS)}:{node.lineno} {node.name}")
    assert len(list(TESTS.rglob("test_*.py"))) > 50  # the walk found the suite
    assert not missing, "tests without a docstring:\n" + "\n".join(missing)
