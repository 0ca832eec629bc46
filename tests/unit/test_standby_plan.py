"""Which partitions a member keeps warm for the others (``--standbys N``)."""

from __future__ import annotations

from consumers.node.standby import standby_partitions

A, B, C = "http://a", "http://b", "http://c"


def test_each_partition_is_kept_warm_by_the_next_members_after_its_owner() -> None:
    owners = {0: A, 1: B, 2: C}
    assert standby_partitions(owners, [A, B, C], A, 1) == {2}  # C's follower wraps to A
    assert standby_partitions(owners, [A, B, C], B, 1) == {0}
    assert standby_partitions(owners, [A, B, C], A, 2) == {1, 2}
    assert standby_partitions(owners, [A, B, C], A, 5) == {1, 2}  # never its own partitions
    assert standby_partitions(owners, [A, B, C], A, 0) == set()
    assert standby_partitions({0: A}, [A], A, 1) == set()


def test_a_departed_owners_partitions_stay_warm_until_the_group_moves_them() -> None:
    # B died: the membership no longer lists it, the group has not reassigned its partition
    # yet; its follower keeps the copy (dropping it now would mean restoring a tail later)
    owners = {0: A, 1: B}
    assert standby_partitions(owners, [A], A, 1) == {1}
    assert standby_partitions({0: A, 1: B, 2: C}, [A, C], C, 1) == {0, 1}  # and now A's
    assert standby_partitions({0: A, 1: B, 2: C}, [A, C], A, 1) == {2}
