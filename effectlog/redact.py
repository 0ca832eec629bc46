"""Keeping secrets out of output: masking for URLs, config mappings, free text and log records.

Two layers. Pattern masking needs no set-up: it hides userinfo passwords in URLs and the
value of any ``name=value`` or ``"name": value`` pair whose name looks secret (password,
secret, token, JAAS config, private key, ...). A process-wide :class:`SecretRegistry` adds
exact-value masking for secrets that could surface anywhere else (an exception from a
client library, a traceback): whoever parses a secret registers it, and
:class:`RedactingFilter` scrubs every registered value from log records.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
#: Registered values shorter than this are not scrubbed as plain substrings (they would
#: mangle ordinary text); pattern masking still hides them in ``name=value`` form.
MIN_SECRET_LENGTH = 4

_SECRET_WORDS = ("password", "passwd", "pwd", "secret", "token", "apikey", "api.key",
                 "credential", "jaas", "private.key", "key.pem", "keystore.key",
                 "authorization", "bearer")
_NOT_SECRET = frozenset({"sasl.oauthbearer.token.endpoint.url", "token.endpoint.url"})

# Every pattern is linear in the length of the text (the CLI scrubs error lines that quote
# user input): a match may only start where a run of name characters starts (the
# lookbehind), and the run's non-letter head is consumed as ``lead``, so no start inside
# a run is ever tried; quoted values are unrolled loops without nested backtracking.
_NAME_CHARS = r"A-Za-z0-9_.\-"
# name=value (query strings, properties files, kwargs reprs); value quoted or bare.
_PAIR = re.compile(rf"(?<![{_NAME_CHARS}])(?P<lead>[0-9_.\-]*)"
                   rf"(?P<name>[A-Za-z][{_NAME_CHARS}]*)(?P<sep>\s*=\s*)"
                   r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&#;,)\]}]+)")
# 'name': value / "name": value (dict reprs, JSON).
_ITEM = re.compile(r"(?P<q>['\"])(?P<name>[^'\"\s]{1,100})(?P=q)(?P<sep>\s*:\s*)"
                   r"(?P<value>'[^'\\]*(?:\\.[^'\\]*)*'|\"[^\"\\]*(?:\\.[^\"\\]*)*\"|[^\s,}\]]+)")
# scheme://user:password@host
_USERINFO = re.compile(r"(?P<head>(?<![A-Za-z0-9+.\-])[0-9+.\-]*[A-Za-z][A-Za-z0-9+.\-]*://"
                       r"[^\s/@:?#]*:)(?P<value>[^\s@/?#]*)(?=@)")


def is_secret_name(name: str) -> bool:
    """Whether a setting or parameter called ``name`` holds a secret (``sasl_password``,
    ``ssl.key.password``, ``sasl.jaas.config``, ``api-token``, ...)."""
    norm = unquote(name).strip().lower().replace("_", ".").replace("-", ".")
    if norm in _NOT_SECRET:
        return False
    return any(word in norm for word in _SECRET_WORDS)


def _mask_value(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return f"{value[0]}{MASK}{value[0]}"
    return MASK


def _mask_pair(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]) or not match["value"]:
        return match[0]
    head = match[0][:match.start("value") - match.start()]
    return head + _mask_value(match["value"])


def mask_patterns(text: str) -> str:
    """``text`` with URL passwords and values of secret-named pairs replaced by ``***``."""
    text = _USERINFO.sub(lambda m: m["head"] + MASK if m["value"] else m[0], text)
    text = _ITEM.sub(_mask_pair, text)
    return _PAIR.sub(_mask_pair, text)


def redact_url(url: str) -> str:
    """A log or broker URL safe to print: password and secret query values masked,
    everything else (host, port, prefix, file paths) kept as written."""
    return mask_patterns(url)


def redact_mapping(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client config with secret values masked (nested mappings too).

    String values are also pattern-masked, so a URL with a password inside a value is safe.
    """
    out: dict[str, Any] = {}
    for name, value in config.items():
        if is_secret_name(str(name)) and value not in (None, ""):
            out[name] = MASK
        elif isinstance(value, Mapping):
            out[name] = redact_mapping(value)
        elif isinstance(value, str):
            out[name] = mask_patterns(value)
        elif isinstance(value, list | tuple):
            out[name] = type(value)(mask_patterns(v) if isinstance(v, str) else v for v in value)
        else:
            out[name] = value
    return out


def secrets_in_url(url: str) -> list[str]:
    """The secret values a URL carries (userinfo password, secret query parameters),
    both as written and percent-decoded, for :meth:`SecretRegistry.add`."""
    found: list[str] = []
    query = url.partition("?")[2].partition("#")[0]
    try:
        password = urlsplit(url).password
    except ValueError:  # e.g. a non-numeric port: fall back to the pattern
        match = _USERINFO.search(url)
        password = match["value"] if match else None
    if password:
        found.append(password)
    for pair in re.split(r"[&;]", query):
        name, sep, value = pair.partition("=")
        if sep and value and is_secret_name(name):
            found.append(value)
    decoded = [unquote(v.replace("+", " ")) for v in found] + [unquote(v) for v in found]
    return list(dict.fromkeys(found + decoded))


class SecretRegistry:
    """A thread-safe set of secret values to scrub, replaced longest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()

    def add(self, value: str | None) -> None:
        """Register one secret value (and its percent-encoded form)."""
        if not value or len(value) < MIN_SECRET_LENGTH:
            return
        with self._lock:
            values = set(self._values) | {value, quote(value, safe="")}
            self._values = tuple(sorted(values, key=len, reverse=True))

    def add_all(self, values: Iterable[str | None]) -> None:
        for value in values:
            self.add(value)

    def clear(self) -> None:
        with self._lock:
            self._values = ()

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)

    def scrub(self, text: str) -> str:
        """``text`` with every registered value replaced by ``***``."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text


#: The process-wide registry that :class:`RedactingFilter` and :func:`scrub_text` use.
SECRETS = SecretRegistry()


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from every log record and from :func:`scrub_text` from now on."""
    SECRETS.add(value)


def register_url_secrets(url: str) -> None:
    """Register the secrets carried by a log or broker URL."""
    SECRETS.add_all(secrets_in_url(url))


def register_mapping_secrets(config: Mapping[str, Any]) -> None:
    """Register the values of every secret-named setting of a client config."""
    for name, value in config.items():
        if isinstance(value, Mapping):
            register_mapping_secrets(value)
        elif isinstance(value, str) and is_secret_name(str(name)):
            SECRETS.add(value)


def scrub_text(text: str, registry: SecretRegistry = SECRETS) -> str:
    """Registered values and secret patterns masked: use on any message shown to people."""
    return mask_patterns(registry.scrub(text))


# Attributes every LogRecord has; anything else on a record came from ``extra=``.
STANDARD_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime",
                                                                       "taskName"}


class RedactingFilter(logging.Filter):
    """Scrubs message, arguments, ``extra`` values and traceback text of each record.

    The traceback is kept as scrubbed ``exc_text`` (which formatters print) and the live
    exception object is dropped. Attach the filter to handlers (filters on a logger do not
    see records propagated from child loggers). The record is rewritten in place, so later
    handlers see the scrubbed text.
    """

    def __init__(self, registry: SecretRegistry = SECRETS, name: str = "") -> None:
        super().__init__(name)
        self.registry = registry

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep what we have, scrubbed
            message = f"{record.msg} {record.args}"
        record.msg = self._scrub(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._scrub(record.exc_text)
        record.exc_info = None  # the live exception still holds the raw text; exc_text suffices
        if record.stack_info:
            record.stack_info = self._scrub(record.stack_info)
        for name, value in list(vars(record).items()):
            if name in STANDARD_RECORD_ATTRS:
                continue
            if isinstance(value, str):
                setattr(record, name, self._scrub(value))
            elif isinstance(value, Mapping):
                setattr(record, name, redact_mapping(value))
        return True

    def _scrub(self, text: str) -> str:
        return scrub_text(text, self.registry)
