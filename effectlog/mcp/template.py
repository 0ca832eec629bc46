"""Target templates: ``mailto:{to}``, ``stripe:{customer}/{currency}`` from a tool's arguments.

A template is literal text with ``{argument}`` or ``{argument.field}`` placeholders (``{{`` and
``}}`` stand for braces). It is parsed once, when the config is loaded, so a bad template is
refused at start; rendering a call only substitutes values.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any

from effectlog.errors import InvalidInput
from effectlog.keys import validate_target

_FIELD_CHARS = frozenset(string.ascii_letters + string.digits + "_-")


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed target template: literal parts and the argument paths between them."""

    text: str
    parts: tuple[str | tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        """Parse ``text``; :class:`InvalidInput` names what is wrong with it."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("target template is empty")
        parts: list[str | tuple[str, ...]] = []
        try:
            pieces = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise InvalidInput(f"bad target template {text!r}: {exc}") from None
        for literal, field, spec, conversion in pieces:
            if literal:
                parts.append(literal)
            if field is None:
                continue
            if spec or conversion:
                raise InvalidInput(f"bad target template {text!r}: {{{field}}} takes no "
                                   "format spec or conversion")
            path = tuple(field.split("."))
            if not all(p and set(p) <= _FIELD_CHARS for p in path):
                raise InvalidInput(f"bad target template {text!r}: {{{field}}} is not an "
                                   "argument name (use {name} or {name.field})")
            parts.append(path)
        return cls(text, tuple(parts))

    @property
    def arguments(self) -> frozenset[str]:
        """The top-level argument names the template reads."""
        return frozenset(p[0] for p in self.parts if isinstance(p, tuple))

    def render(self, arguments: dict[str, Any]) -> str:
        """The target of one call; :class:`InvalidInput` when an argument it needs is missing."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value: Any = arguments
            for name in part:
                if not isinstance(value, dict) or name not in value or value[name] is None:
                    raise InvalidInput(f"argument {'.'.join(part)!r} is needed for the effect's "
                                       f"target {self.text!r}")
                value = value[name]
            out.append(value if isinstance(value, str) else
                       json.dumps(value, sort_keys=True, separators=(",", ":")))
        return validate_target("".join(out))
