"""Provider adapter for HTTP APIs that follow the IETF Idempotency-Key header draft.

``execute`` POSTs to ``/effects/{operation}`` (the operation is the kind bound in the key)
with the ``Idempotency-Key`` and ``Fencing-Epoch`` headers; ``lookup`` GETs ``/lookup``
with the key header. Status codes map onto the provider exceptions: 409 (a duplicate in
flight) and 422 (key reused for another request) are conflicts, 412 a stale epoch, 400 a
definitive failure, 503 an outage; a dropped connection or read timeout after the request
was sent is ambiguous (:class:`ProviderTimeout`).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
from typing import Any
from urllib.parse import parse_qs, urlsplit

from consumers.providers import wire
from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.model import Outcome, State
from effectlog.provider import (
    FencedByProvider,
    LookupResult,
    LookupStatus,
    ProviderConflict,
    ProviderFailed,
    ProviderTimeout,
    ProviderUnavailable,
)
from effectlog.redact import redact_url

logger = logging.getLogger(__name__)

_Response = tuple[int, dict[str, Any]]


class HttpProvider:
    """Talks to one base URL; a new connection per call, so it is safe across threads."""

    def __init__(self, base_url: str, *, lookup_complete: bool = False, retention_s: float = 0.0,
                 timeout_s: float = 10.0) -> None:
        parts = urlsplit(base_url)
        try:
            port = parts.port  # ValueError: not a number, or outside 0-65535
        except ValueError:
            port = 0
        if parts.scheme != "http" or not parts.hostname or port == 0:
            raise InvalidInput(f"not an http://host[:port] provider URL (port 1-65535): "
                               f"{redact_url(base_url)!r}")
        self.host, self.port = parts.hostname, port or 80
        self.prefix = parts.path.rstrip("/")
        self.lookup_complete = lookup_complete
        self.retention_s = retention_s
        self.timeout_s = timeout_s

    @classmethod
    def from_url(cls, url: str) -> HttpProvider:
        """``http://host:port[?lookup_complete=1&retention_s=N&timeout_s=S]``; what the
        query leaves out is asked from the server's ``/capabilities``."""
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        timeout_s = _seconds(query.get("timeout_s"), "timeout_s", positive=True)
        provider = cls(parts._replace(query="").geturl(),
                       timeout_s=10.0 if timeout_s is None else timeout_s)
        retention_s = _seconds(query.get("retention_s"), "retention_s")
        if "lookup_complete" not in query or retention_s is None:
            caps = provider._capabilities(url)
            query.setdefault("lookup_complete", str(caps.get("lookup_complete", False)))
            if retention_s is None:
                try:
                    retention_s = _seconds(str(caps.get("retention_s", 0)), "retention_s",
                                           source=f"{redact_url(url)}{wire.CAPABILITIES_PATH}")
                except InvalidInput as exc:  # the server's answer, not the caller's input
                    raise BackendUnavailable(str(exc)) from None
        provider.lookup_complete = query["lookup_complete"].lower() in ("1", "true", "yes")
        provider.retention_s = retention_s or 0.0
        return provider

    def _capabilities(self, url: str) -> dict[str, Any]:
        """What the server declares; :class:`BackendUnavailable` (exit 4 in the CLI) when it
        cannot be asked: at start an unreachable provider is an outage, not a bug."""
        where = redact_url(url)
        try:
            status, caps = self._request("GET", wire.CAPABILITIES_PATH, {}, None)
        except (ProviderUnavailable, ProviderTimeout) as exc:
            raise BackendUnavailable(f"provider unreachable: {exc}") from None
        if status != 200:
            raise BackendUnavailable(f"provider {where}: {wire.CAPABILITIES_PATH} answered "
                                     f"{status}")
        return caps

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        """POST the effect under its key; returns the provider's (original) result."""
        return self.execute_operation(wire.operation_of(idempotency_key), target, payload_hash,
                                      idempotency_key, fencing_epoch, payload)

    def execute_operation(self, operation: str, target: str, payload_hash: str,
                          idempotency_key: str, fencing_epoch: int, payload: Any) -> Any:
        """:meth:`execute` against an explicitly named operation (path)."""
        body = json.dumps({"target": target, "payload_hash": payload_hash, "payload": payload})
        headers = {wire.KEY_HEADER: wire.encode_key(idempotency_key),
                   wire.EPOCH_HEADER: str(fencing_epoch), "Content-Type": "application/json"}
        status, answer = self._request("POST", wire.operation_path(operation), headers,
                                       body.encode("utf-8"))
        detail = str(answer.get("detail", answer))
        if status in (200, 201):
            return answer.get("result")
        if status == 400:
            raise ProviderFailed(f"provider refused: {detail}", answer.get("result", answer))
        if status == 409:
            raise ProviderConflict(f"a request with this key is in flight: {detail}")
        if status == 422:
            raise ProviderConflict(f"key reused for another request: {detail}")
        if status == 412:
            raise FencedByProvider(detail)
        if status == 503:
            raise ProviderUnavailable(detail)
        raise ProviderTimeout(f"ambiguous answer {status}: {detail}")

    def lookup(self, idempotency_key: str) -> LookupResult:
        """GET the stored outcome by key."""
        try:
            status, answer = self._request("GET", wire.LOOKUP_PATH,
                                           {wire.KEY_HEADER: wire.encode_key(idempotency_key)}, None)
        except (ProviderTimeout, ProviderUnavailable) as exc:
            return LookupResult(LookupStatus.UNAVAILABLE, detail=str(exc))
        if status == 404:
            return LookupResult(LookupStatus.NOT_FOUND)
        if status != 200:
            return LookupResult(LookupStatus.UNAVAILABLE, detail=str(answer.get("detail", status)))
        outcome = Outcome(State(answer["status"]), answer.get("result"), "lookup")
        return LookupResult(LookupStatus.CONFIRMED, outcome, payload_hash=answer.get("payload_hash"))

    def _request(self, method: str, path: str, headers: dict[str, str],
                 body: bytes | None) -> _Response:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise ProviderUnavailable(f"cannot reach {self.host}:{self.port}: {exc}") from exc
            try:
                conn.request(method, self.prefix + path, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.HTTPException, OSError) as exc:
                raise ProviderTimeout(f"no answer from {self.host}:{self.port}: "
                                      f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"detail": raw[:200].decode("utf-8", "replace")}
        return response.status, answer if isinstance(answer, dict) else {"result": answer}


def _seconds(text: str | None, name: str, *, positive: bool = False,
             source: str = "provider URL parameter") -> float | None:
    """The seconds ``text`` gives (None when absent); :class:`InvalidInput` for anything
    but a finite number of at least 0 (above 0 when ``positive``)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        low = "above 0" if positive else "0 or more"
        raise InvalidInput(f"{source} {name}={text[:40]!r}: give a number of seconds, {low}")
    return value
