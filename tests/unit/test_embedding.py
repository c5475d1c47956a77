"""The packaged default embedding model: loads offline, gives sensible unit vectors, ships in
the wheel."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memstream.schemas.errors import ConfigurationError
from memstream.storage.embedding import (
    DEFAULT_MODEL_DIR,
    FastEmbedder,
    StaticEmbedder,
    make_embedder,
)

MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json", "README.md")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedder() -> StaticEmbedder:
    return StaticEmbedder()


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_default_model_loads_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_embedder(None, None) loads the packaged model with the hub off and sockets blocked."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the default embedder tried to reach the network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    e = make_embedder(None, None)
    assert isinstance(e, StaticEmbedder)
    assert e.dim == 256
    assert len(e.embed_query("offline")) == 256


def test_vectors_have_256_dims_and_unit_length(embedder: StaticEmbedder) -> None:
    """Every text gets one 256-dim vector of length 1 (embed and embed_query agree)."""
    texts = ["I prefer dark mode in every editor.", "The deploy failed on Friday.", "ok"]
    vectors = embedder.embed(texts)
    assert len(vectors) == len(texts)
    for v in vectors:
        assert len(v) == 256
        assert math.sqrt(sum(x * x for x in v)) == pytest.approx(1.0, abs=1e-5)
    assert embedder.embed_query(texts[0]) == pytest.approx(vectors[0], abs=1e-6)


def test_similar_sentences_are_closer_than_unrelated_ones(embedder: StaticEmbedder) -> None:
    """Paraphrases score higher cosine similarity than unrelated sentences."""
    cases = [
        (
            "The user likes dark themes in the editor.",
            "She prefers a dark color scheme for coding.",
            "The train to Berlin leaves at nine.",
        ),
        (
            "How do I reset my password?",
            "I forgot my password and need to change it.",
            "Tomatoes grow best in full sun.",
        ),
        (
            "The database migration failed last night.",
            "Last night's schema migration broke.",
            "My cat sleeps on the sofa all day.",
        ),
    ]
    for anchor, close, far in cases:
        a, c, f = embedder.embed([anchor, close, far])
        assert cosine(a, c) > cosine(a, f) + 0.1, (anchor, cosine(a, c), cosine(a, f))


def test_empty_inputs(embedder: StaticEmbedder) -> None:
    """No texts give no vectors; an empty text gives a zero vector instead of failing."""
    assert embedder.embed([]) == []
    assert embedder.embed_query("") == [0.0] * 256


def test_batches_match_single_texts(embedder: StaticEmbedder) -> None:
    """Embedding more texts than one batch gives the same vectors as one at a time."""
    texts = [f"memory number {i} about topic {i % 7}" for i in range(600)]
    batch = embedder.embed(texts)
    assert len(batch) == 600
    for i in (0, 255, 256, 599):
        assert batch[i] == pytest.approx(embedder.embed_query(texts[i]), abs=1e-5)


def test_path_without_a_model_is_a_configuration_error(tmp_path: Path) -> None:
    """A model directory without the model files fails at start-up with ConfigurationError."""
    with pytest.raises(ConfigurationError, match="no static model"):
        make_embedder(None, tmp_path)


def test_unknown_model_name_is_a_configuration_error() -> None:
    """A model name fastembed does not know fails with ConfigurationError, not a driver error."""
    with pytest.raises(ConfigurationError, match="no-such/model"):
        make_embedder("no-such/model", None)


def test_named_model_reads_files_from_path() -> None:
    """A fastembed name plus a local directory loads that directory, no download."""
    e = make_embedder("minishlab/potion-base-8M", DEFAULT_MODEL_DIR)
    assert isinstance(e, FastEmbedder)
    assert e.dim == 256
    assert e.embed_query("dark mode") == pytest.approx(
        StaticEmbedder().embed_query("dark mode"), abs=1e-5
    )


def test_wheel_ships_the_model_files(tmp_path: Path) -> None:
    """The built wheel holds the model, migrations and redaction rules, and the embedder loads
    the model from the wheel."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".memstream",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "tests",
            "docs",
            "deploy",
        ),
    )
    # An isolated build fetches setuptools and wheel; reuse this interpreter's when it has them.
    have_backend = importlib.util.find_spec("wheel") is not None
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)]
    if have_backend:
        cmd.insert(4, "--no-isolation")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(cmd, check=True, capture_output=True, timeout=240, env=env)
    (wheel,) = (tmp_path / "dist").glob("memstream-*.whl")
    inside = "memstream/storage/models/minilm-l6-static/"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {inside + f for f in MODEL_FILES} <= names
        # every other run-time data file: SQL migrations, the vendored gitleaks rules
        assert "memstream/storage/migrations/001_init.sql" in names
        assert "memstream/storage/migrations/002_memory_model.sql" in names
        assert "memstream/storage/migrations/004_session_order.sql" in names
        assert "memstream/pipeline/redact/data/gitleaks.toml" in names
        assert "memstream/console/static/htmx.min.js" in names  # the console, no CDN
        assert "memstream/console/templates/base.html" in names
        assert "memstream/producers/py.typed" in names  # the SDK is typed (PEP 561)
        zf.extractall(tmp_path / "installed", [n for n in names if n.startswith(inside)])
    packed = StaticEmbedder(tmp_path / "installed" / inside)
    assert packed.embed_query("dark mode") == StaticEmbedder().embed_query("dark mode")


def test_loading_the_static_model_leaves_numpy_one_blas_thread() -> None:
    """OpenBLAS's idle threads spin between the embedder's small products: once the static
    model is loaded (in a fresh process whose numpy starts with two BLAS threads), every BLAS
    library numpy loaded runs on one thread."""
    code = (
        "import threadpoolctl\n"
        "from memstream.storage.embedding import StaticEmbedder\n"
        "StaticEmbedder()\n"
        "print(sorted({i['num_threads'] for i in threadpoolctl.threadpool_info()"
        " if i['user_api'] == 'blas'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[1]"
