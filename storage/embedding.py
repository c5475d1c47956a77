"""Embedders: text to unit vectors with fastembed, from local files by default.

The default is a static model (``models/minilm-l6-static``, 256 dims, float16) distilled
from all-MiniLM-L6-v2 with model2vec and shipped inside the package: it loads from local files,
with no network and no torch. ``deploy/scripts/build_static_model.py`` rebuilds it.

``make_embedder`` picks one from the settings:

============  ============  ===================================================
model_name    path          embedder
============  ============  ===================================================
None          None          the packaged static model
None          a directory   a static (model2vec) model in that directory
a name        None          that fastembed model, downloaded to fastembed's cache
a name        a directory   that fastembed model, its files read from the directory
============  ============  ===================================================

Load failures (unknown name, missing files, no network) raise ``ConfigurationError``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memstream.schemas.errors import ConfigurationError
from memstream.storage.ports import Embedder

__all__ = ["DEFAULT_MODEL_DIR", "FastEmbedder", "StaticEmbedder", "make_embedder"]

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "models" / "minilm-l6-static"
# fastembed knows static models by name only; this entry supplies the class and file names,
# the files themselves come from ``specific_model_path``. Its declared dim is not trusted.
_STATIC_DESCRIPTION = "minishlab/potion-base-8M"
_BATCH = 256


def _unit_rows(matrix: Any) -> list[list[float]]:
    arr = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    rows: list[list[float]] = (arr / np.where(norms == 0.0, 1.0, norms)).tolist()
    return rows


def one_blas_thread() -> None:
    """Limit numpy's BLAS to the calling thread, for the whole process. The static model's
    matrix products are a batch of texts by a few thousand token rows: a second BLAS thread
    does not make them faster, and OpenBLAS's idle threads spin between calls, which took a
    core of this 2-core machine away from the stages, NATS and PostgreSQL
    (docs/benchmarks.md, 2026-11-25, "fused stages")."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


class StaticEmbedder:
    """A model2vec static model: the mean of token vectors, numpy only. Thread-safe."""

    def __init__(self, path: Path = DEFAULT_MODEL_DIR) -> None:
        from fastembed.text.static_embedding import StaticTextEmbedding

        if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
            raise ConfigurationError(
                f"no static model (model.safetensors, tokenizer.json) in {path}"
            )
        try:
            self._model = StaticTextEmbedding(_STATIC_DESCRIPTION, specific_model_path=str(path))
        except ValueError as exc:
            raise ConfigurationError(f"cannot load the static model in {path}: {exc}") from exc
        assert self._model.embeddings is not None
        self._dim = int(self._model.embeddings.shape[1])
        self.path = path
        one_blas_thread()
        self.model_id = model_id(self)

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text (an empty text gives a zero vector)."""
        if not texts:
            return []
        vectors: list[list[float]] = np.concatenate(
            [
                self._model.raw_embed(list(texts[i : i + _BATCH]))
                for i in range(0, len(texts), _BATCH)
            ]
        ).tolist()
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """One query vector; the same as ``embed([text])[0]`` (static models have no prefix)."""
        vector: list[float] = self._model.raw_embed([text])[0].tolist()
        return vector


class FastEmbedder:
    """Any fastembed dense model by name (ONNX or static); queries use ``query_embed``."""

    def __init__(self, model_name: str, path: Path | None = None) -> None:
        from fastembed import TextEmbedding

        try:
            self._model = TextEmbedding(
                model_name, specific_model_path=str(path) if path is not None else None
            )
        except (ValueError, OSError) as exc:
            where = f" from {path}" if path is not None else ""
            raise ConfigurationError(
                f"cannot load embedding model {model_name!r}{where}: {exc}"
            ) from exc
        self._dim = len(self.embed_query("dimension probe"))
        self.model_name = model_name
        self.model_id = model_id(self)

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text."""
        if not texts:
            return []
        return _unit_rows(list(self._model.embed(list(texts), batch_size=_BATCH)))

    def embed_query(self, text: str) -> list[float]:
        """One L2-normalised query vector (with the model's query prefix, if it has one)."""
        return _unit_rows(list(self._model.query_embed(text)))[0]


_PROBE = "memstream embedding model probe: which model made this vector?"


def model_id(embedder: Embedder) -> str:
    """A short name of what the model computes, from its vector of a fixed text (rounded to
    1e-3, so that float noise between machines does not tell one model apart from itself):
    two processes with the same model agree whatever its path or name, and another model of
    the same size is told apart."""
    probe = np.rint(np.asarray(embedder.embed([_PROBE])[0], dtype=np.float64) * 1000)
    digest = hashlib.sha256(f"{embedder.dim}:".encode() + probe.astype(np.int32).tobytes())
    return digest.hexdigest()[:12]


def make_embedder(model_name: str | None, path: Path | None) -> Embedder:
    """The embedder the settings name: see the table in the module docstring."""
    if model_name:
        return FastEmbedder(model_name, path)
    return StaticEmbedder(path if path is not None else DEFAULT_MODEL_DIR)
