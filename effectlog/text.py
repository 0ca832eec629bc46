"""Free text people type and people read: checked on the way in, escaped on the way out.

Worker ids, approval authors and reasons are refused when they carry control, format or
bidi characters (ESC, NUL, U+202E, zero-width marks, line separators); anything that still
reaches a terminal from the log (written by another tool, or long ago) is shown through
:func:`printable`, which turns every such character into a visible escape.
"""

from __future__ import annotations

from effectlog.errors import InvalidInput

MAX_FREE_TEXT = 1000
_SHOWN = 60


def printable(text: str) -> str:
    """``text`` with every non-printable character shown as ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN`` (a plain space stays), so nothing in it can steer a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def json_printable(document: str) -> str:
    """A JSON text with every non-printable character written as a ``\\uXXXX`` escape
    (surrogate pairs beyond the BMP): the same JSON value, safe to show on a terminal,
    while printable non-ASCII text (é, 中) stays readable."""
    if document.isprintable():
        return document
    out = []
    for char in document:
        if char.isprintable():
            out.append(char)
            continue
        code = ord(char)
        if code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


def shorten(text: str, limit: int = _SHOWN) -> str:
    """The ``repr`` of ``text`` cut to about ``limit`` characters, for error messages that
    quote what the user gave (a megabyte argument must not become a megabyte error)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def check_free_text(field: str, value: object, *, max_chars: int = MAX_FREE_TEXT,
                    required: bool = True) -> str:
    """``value`` if it is a string of printable characters (spaces allowed) of at most
    ``max_chars``; :class:`InvalidInput` otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string")
    if required and not value.strip():
        raise InvalidInput(f"{field} must not be empty")
    if len(value) > max_chars:
        raise InvalidInput(f"{field} is {len(value)} characters long; the limit is {max_chars}")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise InvalidInput(f"{field} contains the control character {_escape(bad)}: "
                           "control, format and bidi characters are not allowed")
    return value
