"""Schemathesis against the live gateway's /openapi.json: for generated valid and invalid
inputs to every operation, no 5xx and every error has the `{code, message}` shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from hypothesis import HealthCheck

pytestmark = pytest.mark.integration

EXAMPLES = 25  # per operation and generation mode: bounded so the run takes ~a minute


def fuzz(url: str, key: str) -> dict[str, Any]:
    """Run every operation (blocking: called in a thread while the loop serves)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    figures: dict[str, Any] = {
        "operations": 0,
        "examples": 0,
        "failures": [],
        "modes_without_inputs": [],
    }
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]  # an invalid schema fails the run here
        figures["operations"] += 1
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @hypothesis.given(case=op.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
            )
            def check(case: Any) -> None:
                if isinstance(case.body, dict) and "user_key" in case.body:
                    case.body["user_key"] = key  # reach past authentication too
                headers = {"Authorization": f"Bearer {key}"}
                resp = case.call(base_url=url, headers=headers, timeout=30)
                figures["examples"] += 1
                where = f"{case.method.upper()} {case.path} -> {resp.status_code}"
                if resp.status_code >= 500:
                    figures["failures"].append(f"{where}: {resp.text[:200]}")
                elif resp.status_code >= 400:
                    try:
                        body = resp.json()
                    except json.JSONDecodeError:
                        body = None
                    if not (isinstance(body, dict) and set(body) == {"code", "message"}):
                        figures["failures"].append(f"{where}: not the error shape")
                assert key[4:] not in resp.text

            try:
                check()
            except hypothesis.errors.Unsatisfiable:
                # no invalid input exists (an operation without parameters): nothing to send
                figures["modes_without_inputs"].append(
                    f"{op.method.upper()} {op.path} {mode.value}"
                )
    return figures


async def test_schemathesis_no_5xx_and_error_shape(gateway, tenant) -> None:
    """Every operation, positive and negative examples: no 5xx, errors `{code, message}`."""
    key = await gateway.key(tenant)  # tenant-wide: generated user ids are all allowed
    figures = await asyncio.to_thread(fuzz, gateway.url, key)
    print(
        f"schemathesis: {figures['operations']} operations, {figures['examples']} examples, "
        f"{len(figures['failures'])} failures"
    )
    assert figures["operations"] >= 12
    assert figures["failures"] == [], "\n".join(figures["failures"])
