"""What a redacted candidate carries so that processes configured apart are told apart: the
id of its redaction key, and the id of the model that made its vector."""

from datetime import UTC, datetime
from types import SimpleNamespace

from memstream.consumers.stages import carried, embedded, redact_candidate
from memstream.pipeline.redact import Redactor, TenantRedactors, key_id
from memstream.schemas.memory import Candidate, Owner
from memstream.storage.embedding import StaticEmbedder, model_id


def cand(text: str = "mail ann@example.org about the invoice") -> Candidate:
    return Candidate(
        candidate_id="c",
        owner=Owner(tenant="t", user="u"),
        session="s",
        content=text,
        source_event_id="e",
        occurred_at=datetime.now(UTC),
    )


def test_a_redacted_candidate_names_its_key_never_the_key() -> None:
    """The key id differs per key, is the same for a redactor and a tenant set built with
    one key, and does not hold the key."""
    key = b"a-long-secret-key-0123456789"
    one, other = Redactor(key), Redactor(b"another-secret-key-98765")
    assert one.key_id == key_id(key) == TenantRedactors(one).key_id
    assert one.key_id != other.key_id and len(one.key_id) == 12
    assert key.decode() not in one.key_id
    out = redact_candidate(one, cand())
    assert out.redacted and out.key_id == one.key_id and "ann@example.org" not in out.content


def test_a_vector_of_another_model_is_not_taken() -> None:
    """A carried vector is taken when this process's model made it (or, from a message made
    before the field, when its size fits); another model's vector of the same size is
    embedded again."""
    embedder = StaticEmbedder()
    assert model_id(StaticEmbedder()) == embedder.model_id  # one model: one id, every load
    deps = SimpleNamespace(embedder=embedder)
    (c,) = embedded(embedder, [cand()])
    assert c.vector_model == embedder.model_id and carried(deps, c) == c.vector  # type: ignore[arg-type]
    unstamped = c.model_copy(update={"vector_model": None})
    assert carried(deps, unstamped) == c.vector  # type: ignore[arg-type]
    foreign = c.model_copy(update={"vector_model": "0123456789ab"})
    assert carried(deps, foreign) is None  # type: ignore[arg-type]
    short = c.model_copy(update={"vector": c.vector[:-1]})  # type: ignore[index]
    assert carried(deps, short) is None  # type: ignore[arg-type]


def test_the_model_id_tells_models_apart() -> None:
    """Another model (here the same one with its vectors turned) gets another id."""

    class Turned:
        def __init__(self, inner: StaticEmbedder) -> None:
            self.inner, self.dim = inner, inner.dim

        def embed(self, texts: list[str]) -> list[list[float]]:
            return [v[1:] + v[:1] for v in self.inner.embed(texts)]

    base = StaticEmbedder()
    assert model_id(Turned(base)) != base.model_id  # type: ignore[arg-type]
