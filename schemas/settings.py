"""One Settings object, built once at the entry point and passed down.

Environment: ``MEMSTREAM_`` prefix, ``__`` for nesting. With no URLs set, the
embedded stack starts its own NATS, PostgreSQL and Qdrant Edge under ``state_dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Role = Literal["extract", "redact", "dedupe", "store", "recall"]
ROLES: tuple[Role, ...] = ("extract", "redact", "dedupe", "store", "recall")


class StageSettings(BaseModel):
    max_deliver: int = Field(default=8, ge=1)
    # How long a pulled message may go unacked before JetStream delivers it again: what a
    # killed worker's batch waits before another process (or the restarted one) takes it.
    # A batch being handled renews its deadline every third of this (consumers/outage.py),
    # so it bounds only a process that died or froze, not a slow batch (docs/ingest.md).
    ack_wait_s: float = Field(default=10.0, gt=0)
    # Under a backlog, 256 did ~7 % more turns/s than 128 for ~5 % less CPU a turn, recall
    # no slower (docs/benchmarks.md, "nineteenth session")
    batch_size: int = Field(default=256, ge=1, le=1000)
    # Each stage takes its pull batch as one unit (consumers/batching.py, docs/ingest.md);
    # false: one message per handler call, the path a batch falls back to for a message that
    # fails within it
    batched: bool = True
    # A process hands a batch on in memory through the consecutive stages it runs, instead
    # of over their subjects (docs/ingest.md, "Fused stages"): with every stage, from a turn
    # to its stored memories. The subjects still carry what other processes publish to them.
    # Batched only.
    fused: bool = True
    # A fused batch of turns is extracted, redacted and embedded in a helper process while the
    # batch before it is deduplicated and stored (consumers/helper.py; docs/ingest.md): one more
    # core for ingest. `memstream worker` and `memstream dev`, rules extractor only, two or
    # more CPUs.
    helper: bool = True
    # The worker that owns a Qdrant Edge shard opens it in a child process, which also answers
    # recall and the commands; the worker's stages call the index there (consumers/indexproc.py;
    # docs/ingest.md). Recall then no longer waits behind the stages' Python, and the engine's
    # work runs beside them. `memstream worker` and `memstream dev`, two or more CPUs.
    index_process: bool = True
    # The nice value of a worker that does not answer recall itself (its index process does,
    # or it runs only extract and redact), and of its helper: above 0, recall's processes win
    # the cores when both want them, and memories take longer to become recallable
    # (consumers/priority.py; docs/ingest.md). 0: the stages run at the worker's own value.
    ingest_nice: int = Field(default=0, ge=0, le=19)
    # ~13 minutes of an outage ride through retries before a message is dead-lettered
    retry_delays_s: list[float] = Field(default_factory=lambda: [1.0, 5.0, 30.0, 120.0, 300.0])
    # An outage (a server away, consumers/outage.py) holds the message and retries it every
    # 0.5-2 s without using a delivery, for up to this long; then one delivery is used.
    outage_hold_s: float = Field(default=120.0, ge=0)


class LlmSettings(BaseModel):
    """An OpenAI-compatible chat-completions endpoint for the optional LLM extractor."""

    base_url: str  # e.g. http://127.0.0.1:11434/v1 (POST {base_url}/chat/completions)
    model: str
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=10.0, gt=0, le=60)
    max_candidates: int = Field(default=8, ge=1, le=32)
    # after this many failures in a row the rules work alone for cooldown_s
    failures_to_pause: int = Field(default=3, ge=1)
    cooldown_s: float = Field(default=30.0, ge=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMSTREAM_", env_nested_delimiter="__", extra="ignore"
    )

    nats_url: str | None = None  # no credentials in it: they go in the nats_* fields below
    # NATS credentials, never logged or written (producers/connection.py): a .creds file or
    # an NKey seed file (paths), or user + password, or a token.
    nats_creds: Path | None = None
    nats_nkey_seed: Path | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    # The embedded NATS (no nats_url) in operator mode, tenants apart (docs/security.md); the
    # authority is <state_dir>/nats-auth. `memstream dev --bus-auth`.
    embedded_bus_auth: bool = False
    namespace: str = "mem"  # subject prefix; streams are named after it (MEM_TURNS ...)
    database_url: SecretStr | None = None
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    state_dir: Path = Path(".memstream")

    collection: str = "memories"
    # IDF statistics of the keyword leg: per tenant (no tenant's text moves another's scores),
    # per owner, or over the whole collection (fastest). See docs/recall.md.
    idf_scope: Literal["tenant", "owner", "collection"] = "tenant"
    # Dense search width on HNSW-indexed segments (Qdrant Edge); None: the engine's default.
    # 64 trims the dense leg's tail at recall scale and leaves the fused top hits almost
    # unchanged (docs/benchmarks.md).
    hnsw_ef: int | None = Field(default=64, ge=1)
    # Qdrant Edge: the largest index segment, in KB of dense vectors. None: the engine merges
    # every segment into one, and each optimization rebuilds the whole shard (a pause of the
    # index process that grows with it); set, pauses stay short and a search visits every
    # segment, which a large tenant pays (storage/qdrant_edge.py, docs/configuration.md).
    index_segment_kb: int | None = Field(default=None, ge=64)
    # Qdrant Edge: how many segments the engine's merges keep. None: its default, one per CPU
    index_segments: int | None = Field(default=None, ge=1)
    # mlockall the worker: keeps the memory-mapped index in RAM on hosts that reclaim page
    # cache (consumers/memlock.py); needs CAP_IPC_LOCK or an unlimited `ulimit -l`.
    lock_memory: bool = False
    # Hold every CPU's wake-up latency at this many µs while the worker runs (PM QoS,
    # /dev/cpu_dma_latency; consumers/cpulatency.py): 0 keeps idle CPUs polling instead of
    # halting. None: the kernel decides. Needs root.
    cpu_latency_us: int | None = Field(default=None, ge=0)
    embedding_model: str | None = None  # a fastembed model name; default: the packaged static model
    embedding_path: Path | None = None  # a local model directory
    # Keys the redaction placeholders (same value -> same token within a tenant). Required by
    # `memstream worker`; `memstream dev` keeps a random key in the state directory.
    redaction_key: SecretStr | None = None
    # Redaction policies (pipeline.redact.RedactionPolicy fields: labels, allow, deny) for the
    # tenants named here; every other tenant gets all detectors. docs/redaction.md.
    redaction_policies: dict[str, dict[str, Any]] = Field(default_factory=dict)

    # Lifetimes by scope, in seconds (run and session memories expire; others do not).
    ttl_s: dict[str, float] = Field(default_factory=lambda: {"run": 3600.0, "session": 86400.0})
    near_duplicate_similarity: float = Field(default=0.95, ge=0.5, le=1.0)
    sweep_every_s: float = 30.0

    stage: StageSettings = Field(default_factory=StageSettings)
    # What this worker process runs (`memstream worker --stages ...`): any of the four stages
    # and `recall` (the recall and command responders). With Qdrant Edge one process owns the
    # shard and runs dedupe, store and recall together (docs/ingest.md).
    # MEMSTREAM_STAGES=extract,redact (comma-separated, or a JSON list)
    stages: Annotated[tuple[Role, ...], NoDecode] = ROLES
    stream_replicas: int = Field(default=1, ge=1, le=5)  # 3 in a production cluster
    turns_max_age_s: float = 7 * 24 * 3600  # raw turns carry PII: short retention
    duplicate_window_s: float = 120.0
    recall_timeout_s: float = 2.0
    # Recall and commands must carry an API key of their tenant (memstream keys create).
    require_api_key: bool = False
    recall_cache_ttl_s: float | None = 30.0  # None disables the shared query cache
    log_level: str = "INFO"
    # The event loop of `memstream worker` / `memstream dev` and the index process: uvloop
    # where it is installed (a worker dependency off Windows), else the standard one.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    ops_host: str = "127.0.0.1"
    ops_port: int | None = 9464  # /metrics and /healthz; None disables, 0 picks a free port
    # how often the ops port reads consumer lag and stream sizes from JetStream for /metrics
    ops_refresh_s: float = Field(default=5.0, gt=0)
    # The web console (memstream.console): needs an operator token; `memstream dev` makes one
    # when unset, `memstream worker` serves no console without it. None disables the port.
    console_token: SecretStr | None = Field(default=None, min_length=16)
    console_host: str = "127.0.0.1"
    console_port: int | None = 9465
    # Recall responder: requests waiting or running at once (more are answered `unavailable`
    # at once), and the deadline of each (then `timeout`).
    recall_max_pending: int = Field(default=1024, ge=1)
    recall_deadline_s: float = Field(default=5.0, gt=0)
    # Fault benchmark only (memstream bench faults): while this file exists, the vector index
    # answers every call as unavailable. Qdrant Edge runs in-process, so nothing else can take
    # it away and bring it back (see docs/topology.md).
    fault_vector_offline_file: Path | None = None
    # Typed memories come from the cue rules; "rules+llm" adds what an LLM finds
    # (MEMSTREAM_LLM__*), the rules alone whenever the endpoint fails. docs/memory-model.md.
    extractor: Literal["rules", "rules+llm"] = "rules"
    llm: LlmSettings | None = None

    # the HTTP gateway (memstream gateway; memstream dev starts one): 0 picks a free port,
    # None keeps `memstream dev` from starting it
    gateway_host: str = "127.0.0.1"
    gateway_port: int | None = 8010
    # below seed 000's client timeout (10 s): a slow pipeline answers 202 pending, not a
    # request the client gave up on
    gateway_flush_timeout_s: float = Field(default=8.0, gt=0)

    @field_validator("stages", mode="before")
    @classmethod
    def _split_stages(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [name.strip() for name in text.split(",") if name.strip()]
        return value

    @field_validator("stages")
    @classmethod
    def _some_stages(cls, value: tuple[Role, ...]) -> tuple[Role, ...]:
        if not value:
            raise ValueError(f"names no role (from {','.join(ROLES)})")
        return tuple(r for r in ROLES if r in value)  # pipeline order, each once

    @model_validator(mode="after")
    def _llm_configured(self) -> Settings:
        if self.extractor == "rules+llm" and self.llm is None:
            raise ValueError(
                "MEMSTREAM_EXTRACTOR=rules+llm needs MEMSTREAM_LLM__BASE_URL and "
                "MEMSTREAM_LLM__MODEL"
            )
        return self
