"""``/readyz``: whether a node serves, and why not.

Ready means: no loop of the node has stopped, the group has given this member its share of
the partitions, and every partition it holds is restored (serving), none halted. Before the
group's first assignment, while any partition restores or is halted, and once a loop has died,
the answer is 503 with ``why`` (a load balancer or Kubernetes readiness probe then sends
requests elsewhere). A member the group gave no partition (more members than partitions) is
ready: it answers by forwarding. No I/O: the answer comes at once, whatever the log does (``/healthz`` is the
liveness probe and carries the log's figures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


def readiness(*, joined: bool, group: str | None, held: Mapping[int, str],
              restore_left: Callable[[int], int],
              failed: Sequence[str]) -> tuple[bool, dict[str, object]]:
    """(ready, details): ``held`` partition -> status, ``restore_left`` the records a
    restoring partition still applies, ``failed`` the loops that stopped."""
    details: dict[str, object] = {"partitions": {str(p): s for p, s in sorted(held.items())}}
    if failed:
        return False, {**details, "why": f"the {', '.join(failed)} loop(s) stopped"}
    if not joined:
        return False, {**details, "why": f"waiting for group {group} to assign this member "
                                         "its partitions"}
    halted = [str(p) for p, s in sorted(held.items()) if s == "halted"]
    if halted:
        return False, {**details, "why": f"partition(s) {', '.join(halted)} halted before a "
                                         "gap compaction may have made (see /healthz)"}
    restoring = {p: restore_left(p) for p, s in sorted(held.items()) if s == "restoring"}
    if restoring:
        listed = ", ".join(f"{p} ({n} records left)" for p, n in restoring.items())
        return False, {**details, "why": f"restoring partition(s) {listed}",
                       "restoring": {str(p): n for p, n in restoring.items()}}
    if not held:
        details["note"] = ("the group assigned this member no partition (more members than "
                           "partitions): it answers by forwarding")
    return True, details
