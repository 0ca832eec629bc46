"""Texts built to make a backtracking regex quadratic: long runs of name characters,
chains of separators, unterminated quotes. Shared by the scrubbing test and bench/redact.py."""

from __future__ import annotations

from collections.abc import Callable

FAMILIES: dict[str, Callable[[int], str]] = {
    "name run": lambda n: "a" * n,
    "dotted run": lambda n: "a." * (n // 2),
    "dashed run": lambda n: "a-" * (n // 2),
    "digits": lambda n: "1" * n,
    "name then spaces": lambda n: "a" + " " * n,
    "eq chain": lambda n: "a=" * (n // 2),
    "open quotes": lambda n: 'a="' * (n // 3),
    "dict items": lambda n: "'a': '" * (n // 6),
    "escaped quote": lambda n: "'a': '" + "\\'" * (n // 2),
    "userinfo": lambda n: "x://u:" + "v" * n,
    "scheme chain": lambda n: "a://" * (n // 4),
    "secret pairs": lambda n: ("password=" + "x" * 50 + " ") * (n // 60),
}
