"""The credentials `memstream creds` mints: JWT claims and allow lists as nats-server reads
them (the integration tests run them against a real server)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import nkeys

from memstream.consumers import busauth, creds
from memstream.producers.connection import creds_inbox_prefix


def _claims(path: Path) -> dict[str, object]:
    lines = path.read_text().splitlines()
    return busauth.decode_claims(lines[lines.index("-----BEGIN NATS USER JWT-----") + 1])


def test_a_tenant_credential_allows_its_own_subjects_only(tmp_path: Path) -> None:
    """Signed by the account, with T's turns, recall, commands and T's inbox, nothing else."""
    creds.init(tmp_path, "mem")
    out, _ = creds.tenant(
        tmp_path, "mem", "acme.eu", tmp_path / "a.creds", expires_at=2_000_000_000
    )
    claims = _claims(out)
    account = busauth.public_key((tmp_path / creds.ACCOUNT).read_bytes().strip())
    assert claims["iss"] == account and str(claims["sub"]).startswith("U")
    assert claims["exp"] == 2 * 10**9
    nats = claims["nats"]
    assert isinstance(nats, dict)
    assert nats["pub"] == {"allow": ["mem.turns.acme%2Eeu.>", "mem.recall", "mem.cmd.*"]}
    assert nats["sub"] == {"allow": ["_INBOX.t.acme%2Eeu.>"]}
    assert creds_inbox_prefix(out) == "_INBOX.t.acme%2Eeu"
    assert out.stat().st_mode & 0o777 == 0o600


def test_signatures_verify_with_the_signer_key(tmp_path: Path) -> None:
    """Each JWT's signature verifies with its issuer's public key over header.claims."""
    seed = busauth.new_seed(nkeys.PREFIX_BYTE_ACCOUNT)
    user = busauth.public_key(busauth.new_seed(nkeys.PREFIX_BYTE_USER))
    jwt = busauth.user_jwt(seed, user, "u", busauth.agent_permissions("mem", "t"))
    head, body, sig = jwt.split(".")
    kp = nkeys.from_seed(bytearray(seed))
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    assert kp.verify(f"{head}.{body}".encode(), raw)


def test_revocation_lands_in_the_account_jwt(tmp_path: Path) -> None:
    """`creds revoke` puts the user's key in the account's revocations, dated now."""
    creds.init(tmp_path, "mem")
    out, _ = creds.tenant(tmp_path, "mem", "t", tmp_path / "t.creds")
    user = busauth.creds_user(out.read_text())
    operator_jwt = (tmp_path / creds.OPERATOR_JWT).read_text()
    assert creds.revoke(tmp_path, "mem", out) == user
    conf = (tmp_path / creds.AUTH_CONF).read_text()
    account = busauth.public_key((tmp_path / creds.ACCOUNT).read_bytes().strip())
    line = next(ln for ln in conf.splitlines() if ln.strip().startswith(account))
    revoked = busauth.decode_claims(line.split(":", 1)[1].strip())["nats"]["revocations"]
    assert abs(revoked[user] - time.time()) < 5
    assert operator_jwt.strip() in conf  # the operator JWT is unchanged: reload accepts it


def test_replies_go_to_inboxes_only() -> None:
    """The worker answers on inboxes, never inside its namespace or a `$` API space."""
    assert busauth.safe_reply("_INBOX.t.acme.abc.def", "mem")
    assert busauth.safe_reply("_INBOX.x1", "mem")
    assert busauth.safe_reply("reply.elsewhere", "mem")  # no bus auth: any client subject
    for bad in ("mem.turns.b.u.s", "mem.stage.store.b", "mem.dlq.x", "$JS.API.STREAM.DELETE.X"):
        assert not busauth.safe_reply(bad, "mem")
    assert not busauth.safe_reply("", "mem") and not busauth.safe_reply(None, "mem")
