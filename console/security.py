"""Who may use the console, and the protections every response and every change carries.

Principals come from bearer tokens (a file or ``OUTBOXKIT_CONSOLE_TOKENS``), one per line:
``TOKEN ROLE NAME`` with ROLE ``viewer`` or ``operator``. A token is kept only as its SHA-256
and compared in constant time; it is typed once into the login form (a POST body, never a URL)
and the browser then holds an opaque session cookie (HttpOnly, SameSite=Strict).

Every state-changing request is a POST that must carry its session's CSRF token in the form
field ``csrf`` (checked in constant time); the login form, which has no session yet, carries a
token bound to a pre-session cookie instead. Every response has a strict Content-Security-Policy
(scripts and styles from the console's own static files only, no inline script), refuses to be
framed, and is not cached.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from outboxkit.ops.access import OpsError

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")
SESSION_COOKIE = "outboxkit_console"
LOGIN_COOKIE = "outboxkit_console_login"
SESSION_TTL_S = 8 * 3600
CSRF_FIELD = "csrf"
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}


class TokenFileError(OpsError):
    """A tokens file or variable that cannot be read or has a bad line (never the token)."""


@dataclass(frozen=True)
class Principal:
    """Someone signed in: a name (recorded in the audit trail) and a role."""

    name: str
    role: Role

    @property
    def may_act(self) -> bool:
        """Whether this principal may change anything (and see payloads)."""
        return self.role == "operator"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass
class Tokens:
    """Principals by the SHA-256 of their token."""

    by_digest: dict[bytes, Principal] = field(default_factory=dict)

    @classmethod
    def parse(cls, lines: Iterable[str], where: str) -> Tokens:
        """``TOKEN ROLE NAME`` lines; blank lines and ``#`` comments skipped."""
        tokens = cls()
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) != 3 or parts[1] not in ROLES:
                raise TokenFileError(
                    f"{where} line {number}: expected TOKEN ROLE NAME with ROLE viewer or operator"
                )
            token, role, name = parts
            if len(token) < 16:
                raise TokenFileError(f"{where} line {number}: a token has 16 characters at least")
            role_value: Role = "operator" if role == "operator" else "viewer"
            tokens.by_digest[_digest(token)] = Principal(name.strip(), role_value)
        return tokens

    @classmethod
    def load(cls, path: Path | None, environment: str | None) -> Tokens:
        """Tokens from ``path`` and from the variable's value (lines separated by newlines or
        ``;``)."""
        tokens = cls()
        if path is not None:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as error:
                raise TokenFileError(
                    f"cannot read the tokens file {path}: {error.strerror}"
                ) from None
            tokens.by_digest.update(cls.parse(text.splitlines(), str(path)).by_digest)
        if environment:
            lines = environment.replace(";", "\n").splitlines()
            tokens.by_digest.update(cls.parse(lines, "OUTBOXKIT_CONSOLE_TOKENS").by_digest)
        return tokens

    def find(self, token: str) -> Principal | None:
        """The principal of ``token``, compared in constant time against every digest."""
        wanted = _digest(token)
        found = None
        for digest, principal in self.by_digest.items():
            if hmac.compare_digest(digest, wanted):
                found = principal
        return found


@dataclass
class Session:
    """A signed-in browser: its principal, CSRF token and expiry (monotonic seconds)."""

    principal: Principal
    csrf: str
    expires: float


class Sessions:
    """Sessions in this process's memory (a restart signs everyone out)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self._ttl = ttl_s
        self._by_id: dict[str, Session] = {}

    def open(self, principal: Principal) -> tuple[str, Session]:
        """A new session for ``principal``; its id goes in the cookie."""
        self._expire()
        session_id = secrets.token_urlsafe(32)
        session = Session(principal, secrets.token_urlsafe(32), time.monotonic() + self._ttl)
        self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id``, or ``None``."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None or session.expires < time.monotonic():
            self._by_id.pop(session_id, None)
            return None
        return session

    def close(self, session_id: str | None) -> None:
        """Sign out."""
        if session_id:
            self._by_id.pop(session_id, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._by_id.items() if s.expires < now]:
            del self._by_id[key]


def csrf_matches(expected: str, given: object) -> bool:
    """Whether the form's CSRF field is the session's token (constant time)."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def login_token(secret: bytes, nonce: str) -> str:
    """The login form's CSRF token for the pre-session cookie ``nonce``."""
    return hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
