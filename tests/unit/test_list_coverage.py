"""A node's page of effects claims only the partitions it served throughout the read: one
revoked while the page was read may be missing from it, so the caller asks its new owner."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from consumers.node import node as node_module
from consumers.node.gate import PartitionGate
from consumers.node.node import Node
from projections.paging import Page


def test_a_partition_revoked_during_the_read_is_not_claimed_as_covered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = PartitionGate()
    for partition in (0, 1, 2):
        gate.assigned(partition, 5, 5)

    def read_page(reader: Any, state: str, **options: Any) -> Page:
        gate.revoked(1)  # a cooperative rebalance takes partition 1 mid-read
        return Page([], None)

    monkeypatch.setattr(node_module, "read_page", read_page)
    here = SimpleNamespace(gate=gate, reader=None)
    _, covered = Node.list_local(here, ["DISPATCHED"], None, 10)  # type: ignore[arg-type]
    assert covered == {0, 2}
