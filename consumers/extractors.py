"""The optional LLM extractor (``MEMSTREAM_EXTRACTOR=rules+llm``): an OpenAI-compatible
chat-completions endpoint finds typed memories the cue rules miss.

It complements the rules and never replaces them: any failure (connection, timeout, HTTP
status, an answer that does not parse) leaves the turn with what the rules found, counted and
logged by error class, never with the text or the endpoint's answer. After
``failures_to_pause`` failures in a row the endpoint is left alone for ``cooldown_s``, so an
outage costs one timeout per cool-down instead of one per turn (a stage handles its messages
one after the other; many timeouts in a row would outlast the consumer's ack wait).

The endpoint sees the turn's kept messages after redaction with the tenant's policy: no
personal data or secret leaves for a third party that the store would not keep either.
"""

from __future__ import annotations

import time

import httpx

from memstream.consumers.logs import log
from memstream.pipeline import llm_extract
from memstream.pipeline.extract import episode_text
from memstream.pipeline.redact import Redacts
from memstream.schemas.events import TurnEvent
from memstream.schemas.memory import Candidate
from memstream.schemas.settings import LlmSettings


class LlmExtractor:
    def __init__(
        self,
        settings: LlmSettings,
        redactor: Redacts,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings, self.redactor = settings, redactor
        headers = {}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._http = httpx.AsyncClient(
            base_url=settings.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=settings.timeout_s,
            transport=transport,
        )
        self.calls = 0
        self.failures = 0
        self.found = 0
        self._in_a_row = 0
        self._paused_until = 0.0

    async def candidates(self, event: TurnEvent) -> list[Candidate]:
        """The typed memories the endpoint finds in the turn; [] on any failure."""
        text = episode_text(event)
        if not text or time.monotonic() < self._paused_until:
            return []
        turn = self.redactor.redact(text, event.tenant).text
        body = llm_extract.request_body(self.settings.model, turn)
        self.calls += 1
        try:
            response = await self._http.post("chat/completions", json=body)
            response.raise_for_status()
            found = llm_extract.candidates(
                event,
                llm_extract.answer_text(response.json()),
                limit=self.settings.max_candidates,
            )
        except (httpx.HTTPError, ValueError) as exc:  # JSON and shape errors are ValueErrors
            self._failed(exc)
            return []
        self._in_a_row = 0
        self.found += len(found)
        return found

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self._in_a_row += 1
        paused = self._in_a_row >= self.settings.failures_to_pause
        if paused:
            self._paused_until = time.monotonic() + self.settings.cooldown_s
            self._in_a_row = 0
        status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
        log.warning(
            "extract.llm_failed",
            error=type(exc).__name__,
            status=status,
            paused_s=self.settings.cooldown_s if paused else 0,
        )

    async def close(self) -> None:
        await self._http.aclose()
