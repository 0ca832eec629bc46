"""Who may write through the console: the console token, sessions and cross-site checks.

Reading needs nothing (like the query API next to it). Writing (a decision on an effect)
needs, all at once:

- people configured at ``serve``: a users file (``--console-users``: each person logs in
  with their own name and password, and decides under that name; see
  :mod:`consumers.console.users`), or one shared console token (``--console-token``: whoever
  has it types a name); neither: the console is read-only;
- a session cookie, issued by ``POST /login``, naming the person: HMAC-signed
  with a key drawn at start-up (a restart ends every session), ``HttpOnly``,
  ``SameSite=Strict``, valid for :data:`SESSION_TTL_S`;
- the session's CSRF token in the form (an HMAC of the session, so it needs no storage);
- an ``Origin`` (or, without one, a ``Referer``) naming this very server.

When the server listens on a loopback address, requests must also name a loopback host,
so a DNS-rebinding page cannot reach the console under a name of its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from aiohttp import web

from consumers.console.users import Users

COOKIE = "effectlog_console"
CSRF_FIELD = "csrf"
SESSION_TTL_S = 12 * 3600
_LOOPBACK_NAMES = ("localhost", "localhost.")


class WriteRefused(Exception):
    """A write that the console refuses (HTTP 403), with the reason shown to the user."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is loopback."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class ConsoleAuth:
    """Checks the console token, issues and verifies sessions, and guards writes."""

    def __init__(self, token: str | None, *, loopback_only: bool,
                 ttl_s: float = SESSION_TTL_S, users: Users | None = None) -> None:
        self._token = None if not token or users is not None else token.encode("utf-8")
        self.users = users
        self.loopback_only = loopback_only
        self.ttl_s = ttl_s
        self._key = secrets.token_bytes(32)

    @property
    def writable(self) -> bool:
        """Whether anyone can log in (otherwise nothing can be written)."""
        return self._token is not None or self.users is not None

    @property
    def named(self) -> bool:
        """Whether people log in under their own names (a users file)."""
        return self.users is not None

    def token_matches(self, given: str) -> bool:
        return self._token is not None and hmac.compare_digest(given.encode("utf-8"),
                                                               self._token)

    def log_in(self, name: str, secret: str) -> str | None:
        """Who logs in: the user's name (users file), "" (the shared token), or None."""
        if self.users is not None:
            return self.users.check(name, secret)
        return "" if self.token_matches(secret) else None

    # -- sessions ------------------------------------------------------------------------

    def new_session(self, user: str = "") -> str:
        """A signed cookie value: ``nonce.issued.user.signature`` (user in base64url)."""
        nonce, issued = secrets.token_urlsafe(18), str(int(time.time()))
        who = base64.urlsafe_b64encode(user.encode("utf-8")).decode("ascii").rstrip("=")
        return f"{nonce}.{issued}.{who}.{self._sign('session', nonce, issued, who)}"

    def _session(self, request: web.Request) -> tuple[str, str] | None:
        """(nonce, user) of the request's valid session, or None."""
        parts = request.cookies.get(COOKIE, "").split(".")
        if len(parts) != 4 or not self.writable:
            return None
        nonce, issued, who, signature = parts
        if not (nonce and issued.isdigit() and signature):
            return None
        if not hmac.compare_digest(signature, self._sign("session", nonce, issued, who)):
            return None
        if time.time() - int(issued) > self.ttl_s:
            return None
        try:
            user = base64.urlsafe_b64decode(who + "=" * (-len(who) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if self.named and not user:
            return None  # a token session from before a restart with a users file
        return nonce, user

    def session(self, request: web.Request) -> str | None:
        """The nonce of the request's valid session, or None."""
        found = self._session(request)
        return None if found is None else found[0]

    def user(self, request: web.Request) -> str | None:
        """The logged-in person's name ("" for a shared-token session), or None."""
        found = self._session(request)
        return None if found is None else found[1]

    def csrf(self, nonce: str) -> str:
        """The CSRF token of the session ``nonce``."""
        return self._sign("csrf", nonce)

    def set_cookie(self, response: web.StreamResponse, request: web.Request,
                   user: str = "") -> None:
        response.set_cookie(COOKIE, self.new_session(user), httponly=True, samesite="Strict",
                            secure=request.secure, path="/", max_age=int(self.ttl_s))

    def _sign(self, *parts: str) -> str:
        message = "|".join(parts).encode("utf-8")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:43]

    # -- checks --------------------------------------------------------------------------

    def host_allowed(self, request: web.Request) -> bool:
        """False for a non-loopback Host while the server listens on loopback only."""
        if not self.loopback_only:
            return True
        host = urlsplit(f"//{request.host}").hostname or ""
        return is_loopback(host)

    def check_same_origin(self, request: web.Request) -> None:
        """Refuse a request whose Origin (or Referer) is not this server."""
        own = f"{request.scheme}://{request.host}"
        origin = request.headers.get("Origin")
        if origin is not None:
            if origin != own:
                raise WriteRefused(f"cross-site request refused (Origin {origin[:100]})")
            return
        referer = request.headers.get("Referer", "")
        if referer != own and not referer.startswith(own + "/"):
            raise WriteRefused("cross-site request refused (no Origin or Referer of this "
                               "console)")

    def check_write(self, request: web.Request, form: Mapping[str, str]) -> str:
        """The session nonce of an allowed write; :class:`WriteRefused` otherwise."""
        if not self.writable:
            raise WriteRefused("this console is read-only: serve was started without "
                               "--console-users or --console-token")
        self.check_same_origin(request)
        nonce = self.session(request)
        if nonce is None:
            raise WriteRefused("log in first")
        if not hmac.compare_digest(str(form.get(CSRF_FIELD, "")), self.csrf(nonce)):
            raise WriteRefused("the form's CSRF token is missing or stale: reload the page")
        return nonce
