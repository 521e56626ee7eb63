"""Who may use the console, and the protections every response and every change carries.

Principals come from bearer tokens (a file or ``OUTBOXKIT_CONSOLE_TOKENS``), one per line:
``TOKEN ROLE NAME [tenants=a,b]`` with ROLE ``viewer`` or ``operator``. A token is kept only as
its SHA-256 and compared in constant time; it is typed once into the login form (a POST body,
never a URL) and the browser then holds an opaque session cookie (HttpOnly, SameSite=Strict).

Or from a trusted reverse proxy (:class:`ProxyIdentity`): a header names the user, and is
believed only on a request whose peer address is in one of the trusted networks; from any other
address it is ignored. The role comes from a second header or from a users file (``USER ROLE
[tenants=a,b]`` lines).

A principal with ``tenants`` sees and acts on those tenants only.

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
from collections.abc import Iterable, Mapping
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


TENANTS_PREFIX = "tenants="


@dataclass(frozen=True)
class Principal:
    """Someone signed in: a name (recorded in the audit trail), a role, and the tenants it is
    limited to (``None``: every tenant)."""

    name: str
    role: Role
    tenants: frozenset[str] | None = None

    @property
    def may_act(self) -> bool:
        """Whether this principal may change anything (and see payloads)."""
        return self.role == "operator"

    @property
    def limited(self) -> bool:
        """Whether this principal is limited to some tenants."""
        return self.tenants is not None

    def allows(self, tenant: str) -> bool:
        """Whether this principal may see and act on ``tenant``."""
        return self.tenants is None or tenant in self.tenants


def _principal(words: list[str], role: str, where: str) -> Principal:
    """``NAME words [tenants=a,b]`` and a role as a :class:`Principal`; ``where`` names the
    line in errors."""
    tenants: frozenset[str] | None = None
    if words and words[-1].startswith(TENANTS_PREFIX):
        names = [t for t in words.pop()[len(TENANTS_PREFIX) :].split(",") if t]
        if not names:
            raise TokenFileError(f"{where}: tenants= names one tenant at least")
        tenants = frozenset(names)
    if role not in ROLES or not words:
        raise TokenFileError(f"{where}: expected a name and ROLE viewer or operator")
    role_value: Role = "operator" if role == "operator" else "viewer"
    return Principal(" ".join(words), role_value, tenants)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass
class Tokens:
    """Principals by the SHA-256 of their token."""

    by_digest: dict[bytes, Principal] = field(default_factory=dict)

    @classmethod
    def parse(cls, lines: Iterable[str], where: str) -> Tokens:
        """``TOKEN ROLE NAME [tenants=a,b]`` lines; blank lines and ``#`` comments skipped."""
        tokens = cls()
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) < 3 or parts[1] not in ROLES:
                raise TokenFileError(
                    f"{where} line {number}: expected TOKEN ROLE NAME with ROLE viewer or operator"
                )
            token, role, *name = parts
            if len(token) < 16:
                raise TokenFileError(f"{where} line {number}: a token has 16 characters at least")
            tokens.by_digest[_digest(token)] = _principal(name, role, f"{where} line {number}")
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


class ProxyRefusal(Exception):
    """A trusted proxy named a user the console has no role for."""


@dataclass(frozen=True)
class ProxyIdentity:
    """Identity from a trusted reverse proxy.

    ``header`` names the user; it is read only when the request's peer address (the proxy's,
    not any ``X-Forwarded-For``) is in ``trusted``. The role is ``role_header``'s value when
    that is set, else the user's line in ``users``; ``users`` also gives the tenants a user is
    limited to. With a users file, a user not in it gets a 403, as does one with no role.
    """

    header: str
    trusted: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    role_header: str | None = None
    users: dict[str, Principal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.trusted:
            raise TokenFileError("a proxy header needs at least one trusted proxy address")
        if self.role_header is None and not self.users:
            raise TokenFileError("a proxy header needs a role header or a users file")

    @staticmethod
    def networks(texts: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """CIDRs (or single addresses) as networks; :class:`TokenFileError` for a bad one."""
        found = []
        for text in texts:
            try:
                found.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                message = f"--trusted-proxy {text!r} is not an address or CIDR"
                raise TokenFileError(message) from None
        return tuple(found)

    @staticmethod
    def parse_users(lines: Iterable[str], where: str) -> dict[str, Principal]:
        """``USER ROLE [tenants=a,b]`` lines; blank lines and ``#`` comments skipped."""
        users = {}
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) not in (2, 3):
                raise TokenFileError(f"{where} line {number}: expected USER ROLE [tenants=a,b]")
            user, role, *rest = parts
            users[user] = _principal([user, *rest], role, f"{where} line {number}")
        return users

    @classmethod
    def load_users(cls, path: Path) -> dict[str, Principal]:
        """The users file at ``path``."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise TokenFileError(f"cannot read the users file {path}: {error.strerror}") from None
        return cls.parse_users(text.splitlines(), str(path))

    def trusts(self, peer: str | None) -> bool:
        """Whether ``peer`` (the connection's address) is a trusted proxy."""
        if peer is None:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.trusted)

    def identify(self, peer: str | None, headers: Mapping[str, str]) -> Principal | None:
        """The principal a trusted proxy names, ``None`` when ``peer`` is not trusted or sent
        no user; :class:`ProxyRefusal` for a user without a role."""
        if not self.trusts(peer):
            return None
        user = (headers.get(self.header) or "").strip()
        if not user:
            return None
        listed = self.users.get(user)
        if self.users and listed is None:
            raise ProxyRefusal(f"{user[:128]} is not in the console's users file")
        role = (headers.get(self.role_header) or "").strip() if self.role_header else ""
        if role:
            if role not in ROLES:
                raise ProxyRefusal(f"{self.role_header} must be viewer or operator")
            role_value: Role = "operator" if role == "operator" else "viewer"
            return Principal(user[:128], role_value, None if listed is None else listed.tenants)
        if listed is None:
            raise ProxyRefusal(f"{user[:128]} has no role in the console")
        return listed


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
