"""What a worker knows of each key, and how it learns the state a read or a write needs.

The worker's core (:mod:`effectlog.worker.core`) builds on this: current state for reads
and for judging again (one ListOffsets, the view's snapshot, the key tail's proof), and the
state a write builds on where writes are judged after they land (no ListOffsets at all).
"""

from __future__ import annotations

from effectlog.errors import NotFound
from effectlog.machine import check_binding
from effectlog.model import EffectEvent
from effectlog.view import AS_IS, Seen
from effectlog.worker.requests import (
    Current,
    CurrentAndEnd,
    CurrentAt,
    PartitionEnd,
    Steps,
    Untouched,
    ask,
)

#: Keys remembered per worker (oldest forgotten first).
REMEMBERED = 10_000


class KeyKnowledge:
    """The states one worker identity last saw, per key.

    ``atomic``: the shell reads through its own log view on a backend with compare-and-append,
    so each append is conditional on the key's last record (``known`` holds the offset it is
    conditional on). Otherwise appends are plain and judged after they land (``verify``), and
    ``basis`` holds the state the key's next write builds on, with how far it reaches.
    """

    def __init__(self, *, atomic: bool, verify: bool) -> None:
        self.atomic = atomic
        self.verify = verify
        self.known: dict[str, tuple[EffectEvent | None, int | None]] = {}
        self.basis: dict[str, Seen] = {}

    def load(self, key: str, fresh: bool = False) -> Steps[EffectEvent | None]:
        """Current snapshot of ``key``; in atomic mode also remembers the offset it is at.

        Writes build on :meth:`_writable` instead where they are judged after they land;
        this is the current state, for reads and for judging again. It starts with the
        partition's end offset (one ListOffsets): when the partition still ends where the
        state this worker last saw of the key reaches, or the log proves that
        nothing of the key was written since (:meth:`~effectlog.log.base.EventLog.untouched`),
        that state is current; an empty partition holds no effect. Otherwise (``fresh`` or a
        key not seen before) the view is asked for what it has applied now, which is current
        when the log proves nothing of the key came after it, and else asked again once its
        projection has applied that end; or, for a key this worker wrote, at least as far as
        the state it last saw.
        """
        if not self.atomic:
            basis = None if fresh else self.basis.get(key)
            if basis is None or not basis.through:
                seen, end = yield from ask(CurrentAndEnd(key))
                seen = Seen(None, 0) if end == 0 else (yield from self._current_at(key, seen, end))
            else:
                end = yield from ask(PartitionEnd(key))
                if (yield from self._still_current(key, basis, end)):
                    seen = Seen(basis.event, end)
                else:
                    seen = yield from ask(Current(key, basis.through - 1))
            self._set_basis(key, seen)
            return seen.event
        if fresh or key not in self.known:
            self.remember(key, *(yield from ask(CurrentAt(key))))
        return self.known[key][0]

    def _current_at(self, key: str, seen: Seen, end: int) -> Steps[Seen]:
        """The key's state at partition end ``end``, given the view's ``seen`` read without
        waiting: that one, when it reaches ``end`` or the log proves nothing of the key came
        after it; else the view's once it has applied ``end`` (a view that does not say how
        far it reaches is taken as current)."""
        if seen.through is None:
            return seen
        if (yield from self._still_current(key, seen, end)):
            return Seen(seen.event, max(end, seen.through))
        return (yield from ask(Current(key, end - 1)))

    def _still_current(self, key: str, seen: Seen, end: int) -> Steps[bool]:
        """Whether ``seen`` is the key's state at partition end ``end``."""
        through = seen.through
        if through is None:
            return False
        if through >= end:
            return True
        return through > 0 and (yield from ask(Untouched(key, through, end)))

    def _writable(self, key: str) -> Steps[tuple[EffectEvent | None, bool]]:
        """The state of ``key`` to build a write on, and whether it is unconfirmed.

        Where appends are judged after they are written (not atomic, ``verify``), that is the
        state this worker last saw of the key (its own accepted write), else the view's
        snapshot as it stands, with no ListOffsets and no wait: the write is then accepted
        only when it provably follows that state (:meth:`_follows`) or the view says it was,
        as a conditional append on SQLite is judged on the log. Otherwise the current state
        (:meth:`load`).
        """
        if self.atomic or not self.verify:
            return (yield from self.load(key)), False
        basis = self.basis.get(key)
        if basis is not None and basis.through:
            return basis.event, True
        seen = yield from ask(Current(key, AS_IS))
        self._set_basis(key, seen)
        return seen.event, seen.through is not None  # a view that does not say: as current

    def require(self, key: str) -> Steps[EffectEvent]:
        current = yield from self.load(key)
        if current is None:
            raise NotFound(f"no effect with key {key}")
        return current

    def existing(self, created: EffectEvent, fresh: bool = False) -> Steps[EffectEvent | None]:
        """The key's current record if the effect exists (same payload), else None.

        In atomic mode a key this worker has not seen is not read: appending "no record yet"
        fails if it exists, and only then is it read (one query fewer). Raises
        :class:`PayloadMismatch` when the key exists with another payload.
        """
        key = created.idempotency_key
        if not fresh and self.atomic and key not in self.known:
            return None
        existing = yield from self.load(key, fresh=fresh)
        if existing is not None:
            check_binding(existing, created)
        return existing

    def _existing_to_write_on(self, created: EffectEvent, fresh: bool = False
                              ) -> Steps[tuple[EffectEvent | None, bool]]:
        """:meth:`existing`, as :meth:`_writable` reads it unless ``fresh``; and whether it
        is unconfirmed."""
        if fresh or self.atomic:
            return (yield from self.existing(created, fresh=fresh)), False
        existing, unconfirmed = yield from self._writable(created.idempotency_key)
        if existing is not None:
            check_binding(existing, created)
        return existing, unconfirmed

    def forget(self, key: str) -> None:
        """Trust nothing known of ``key`` (an append of it may or may not have landed)."""
        self.known.pop(key, None)
        self.basis.pop(key, None)

    def _set_basis(self, key: str, seen: Seen) -> None:
        if len(self.basis) >= REMEMBERED and key not in self.basis:
            self.basis.pop(next(iter(self.basis)))
        self.basis[key] = seen

    def remember(self, key: str, event: EffectEvent | None, offset: int | None) -> None:
        if len(self.known) >= REMEMBERED:
            self.known.pop(next(iter(self.known)))
        self.known[key] = (event, offset)
