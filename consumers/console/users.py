"""The console's people: named users with hashed passwords, in a file (``--console-users``).

One user a line, ``name:scrypt:N:r:p:SALT:HASH`` (base64 salt and hash; ``#`` starts a
comment), written by ``effectlog console-users add NAME --file FILE``. A password is never
stored: only its scrypt hash (Python's :func:`hashlib.scrypt`, a memory-hard KDF), checked
in constant time. Each person logs in under their own name, and a decision is recorded
under that name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from effectlog.errors import InvalidInput

#: scrypt's cost: 16 MiB of memory and ~50 ms a check on a small machine.
N, R, P = 2**14, 8, 1
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}")
MIN_PASSWORD = 10


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hash(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32,
                          maxmem=256 * 1024 * 1024)


def hash_line(name: str, password: str) -> str:
    """The users-file line of ``name`` with a fresh salt."""
    check_name(name)
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"a console password has at least {MIN_PASSWORD} characters")
    salt = secrets.token_bytes(16)
    return f"{name}:scrypt:{N}:{R}:{P}:{_b64(salt)}:{_b64(_hash(password, salt, N, R, P))}"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidInput(f"a console user name is 1-64 letters, digits, spaces or ._@- "
                           f"(starting with a letter or digit), not {name[:80]!r}")
    return name


@dataclass(frozen=True, slots=True)
class _Entry:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes


class Users:
    """The users of one file; :meth:`check` says who a name and password are, or None."""

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self._entries = entries

    @staticmethod
    def read(path: str | os.PathLike[str]) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InvalidInput(f"cannot read the console users file {path}: {why}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Users:
        text = cls.read(path)
        entries: dict[str, _Entry] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(":")
            try:
                name, scheme, n, r, p, salt, digest = parts
                if scheme != "scrypt":
                    raise ValueError(scheme)
                entries[check_name(name)] = _Entry(int(n), int(r), int(p),
                                                   base64.b64decode(salt, validate=True),
                                                   base64.b64decode(digest, validate=True))
            except (ValueError, InvalidInput):
                raise InvalidInput(f"{path}:{number}: expected name:scrypt:N:r:p:SALT:HASH "
                                   "(write it with `effectlog console-users add`)") from None
        if not entries:
            raise InvalidInput(f"the console users file {path} names nobody")
        return cls(entries)

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def check(self, name: str, password: str) -> str | None:
        """``name`` when its password matches, else None (the same work either way)."""
        entry = self._entries.get(name)
        probe = entry or _Entry(N, R, P, b"\0" * 16, b"\0" * 32)
        digest = _hash(password, probe.salt, probe.n, probe.r, probe.p)
        return name if entry is not None and hmac.compare_digest(digest, entry.digest) else None


def add_user(path: str | os.PathLike[str], name: str, password: str) -> bool:
    """Add ``name`` to the file (created 0600), replacing an earlier line of the same name;
    True when it replaced one. A file that is not a users file is refused (InvalidInput),
    never rewritten."""
    line = hash_line(name, password)
    target = Path(path)
    kept, replaced = [], False
    if target.exists():
        text = Users.read(target)
        if any(row.strip() and not row.strip().startswith("#") for row in text.splitlines()):
            Users.load(target)  # every line a user's, or nothing is written
        for raw in text.splitlines():
            if raw.split(":", 1)[0] == name:
                replaced = True
            else:
                kept.append(raw)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("".join(f"{row}\n" for row in [*kept, line]))
    return replaced
