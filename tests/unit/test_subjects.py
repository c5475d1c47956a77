"""Subject tokens and names."""

from hypothesis import given
from hypothesis import strategies as st

from memstream.schemas.subjects import Subjects, token, untoken


@given(st.text(max_size=40))
def test_token_roundtrips_any_id(value: str) -> None:
    """Any id (dots, wildcards, spaces, unicode) encodes to a safe token and back."""
    tok = token(value)
    assert not any(ch in tok for ch in ".*> \t\n")
    assert untoken(tok) == value


def test_distinct_ids_give_distinct_tokens() -> None:
    """Encoding is injective on ids a naive escaping would collide (a.b vs a%2Eb)."""
    assert token("a.b") != token("a%2Eb")
    assert token("") != token("%00") or untoken(token("")) == ""


def test_request_subjects_are_outside_every_stream() -> None:
    """mem.recall and mem.cmd.* are covered by no stream's subject filter."""
    s = Subjects("mem")
    filters = [s.turns_filter(), s.stage_filter(), s.events(), s.dlq()]
    for req in (s.recall, s.cmd("forget")):
        for f in filters:
            prefix = f.removesuffix(">")
            assert not req.startswith(prefix)


def test_namespace_names_streams() -> None:
    """Streams follow the namespace so tests and deployments can share a server."""
    assert Subjects("mem").stream("turns") == "MEM_TURNS"
    assert Subjects("t1-x").stream("dlq") == "T1_X_DLQ"
    assert Subjects("t1").turns("acme", "a.b", "s 1") == "t1.turns.acme.a%2Eb.s%201"


def test_the_empty_id_and_nul_have_different_tokens() -> None:
    """ "" and "\\x00" were both "%00": two ids on one subject."""
    assert token("") != token("\x00")
    assert untoken(token("")) == "" and untoken(token("\x00")) == "\x00"


def test_stage_subjects_name_the_owner_and_still_take_the_tenant_form() -> None:
    """A candidate's stage subject carries its owner (what flush counts by); the body must
    match it, and the tenant-only form of candidates published before is still accepted."""
    s = Subjects("mem")
    alice, helper = "alice\x1e", "alice\x1ehelper"
    subject = s.stage("store", "acme", alice)
    assert subject == "mem.stage.store.acme.alice%1E"
    assert s.stage_mismatch(subject, "store", "acme", alice) is None
    assert s.stage_mismatch(s.stage("store", "acme"), "store", "acme", alice) is None
    assert s.stage_mismatch(subject, "store", "acme", helper) is not None
    assert s.stage_mismatch(subject, "dedupe", "acme", alice) is not None
    assert s.parse_stage(subject) == ("store", "acme") and s.replayable(subject)
    assert s.stage_owner_filter("acme", alice) == "mem.stage.*.acme.alice%1E"
    assert s.stage_filter("store") == "mem.stage.store.>"
