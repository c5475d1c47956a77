"""Expiries: whether any stored point of a tenant has expired, behind the Edge adapter's
choice to leave the expiry condition out of a search."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memstream.storage.expiries import Expiries


def test_only_a_passed_expiry_of_the_tenant_counts() -> None:
    """A point expiring later, or another tenant's expired point, does not count."""
    e = Expiries()
    e.add("acme", "p1", 100.0)
    e.add("globex", "p2", 10.0)
    assert not e.any_expired("acme", 99.0)
    assert e.any_expired("acme", 100.0) and e.any_expired("globex", 50.0)
    assert not e.any_expired("initech", 1e12)


def test_removed_points_stop_counting_and_overlap_errs_towards_checking() -> None:
    """An overwrite adds the new expiry before removing the old: in between both count."""
    e = Expiries()
    e.add("acme", "p1", 10.0)
    e.add("acme", "p1", 500.0)  # the overwrite, before the engine write
    assert e.any_expired("acme", 20.0)  # the old, expired version may still be stored
    e.remove("acme", "p1", 10.0)  # after the engine write
    assert not e.any_expired("acme", 20.0) and e.any_expired("acme", 500.0)
    e.remove("acme", "p1", 500.0)
    assert not e.any_expired("acme", 1e12) and e.held("acme") == 0


_OPS = st.lists(
    st.tuples(st.booleans(), st.sampled_from("ab"), st.sampled_from("xyz"), st.integers(0, 9)),
    max_size=40,
)


@given(_OPS, st.integers(0, 10))
def test_matches_a_plain_count_of_live_points(ops, now: int) -> None:
    """Against a reference multiset, for any sequence of adds and removes."""
    e, live = Expiries(), []
    for add, tenant, pid, at in ops:
        if add:
            e.add(tenant, pid, float(at))
            live.append((tenant, pid, float(at)))
        elif (tenant, pid, float(at)) in live:
            e.remove(tenant, pid, float(at))
            live.remove((tenant, pid, float(at)))
    for tenant in "ab":
        want = any(t == tenant and at <= now for t, _, at in live)
        assert e.any_expired(tenant, float(now)) == want
