"""Where a PostgreSQL URL points: hosts and ports, ``target_session_attrs``, ``connect_timeout``.

Users spell several hosts three ways, and outboxkit reads all three into one
:class:`PgAddress`:

- libpq's: ``postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write``;
- SQLAlchemy's repeated ``host``: ``postgresql://u:p@/db?host=h1:5432&host=h2:5433&...``;
- lists: ``postgresql://u:p@/db?host=h1,h2&port=5432,5433&...``.

Each driver gets it in the spelling it understands: engines (SQLAlchemy's asyncpg and psycopg
dialects) get ``host=h1,h2&port=p1,p2`` (:func:`engine_url`), libpq and asyncpg DSNs get the
hosts in the URL's authority (:func:`libpq_uri`). SQLAlchemy 2.1's asyncpg dialect reads both
of its spellings but needs every port, and hands the query's other parameters to
``asyncpg.connect`` as keywords: ``target_session_attrs`` works so, ``connect_timeout`` (asyncpg
says ``timeout``) would not, so outboxkit's engines translate it
(:func:`outboxkit.outbox.db.make_async_engine`). asyncpg reading a DSN takes the last of
repeated ``host=`` parameters and sends unknown ones to the server as settings, hence
:func:`libpq_uri`. asyncpg bounds a whole connect by one
``timeout``, so a first host that never answers would use it all up: with several hosts,
outboxkit's asyncpg connections try them one by one, each bounded by the connect timeout, as
libpq does (:func:`connect_in_turn`). ``connect_timeout`` is libpq's (seconds, per host; ``0``
waits for ever); without it outboxkit gives up after :data:`DEFAULT_CONNECT_TIMEOUT_S`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlencode

from outboxkit.outbox.errors import InvalidDatabaseUrlError
from sqlalchemy.engine import URL, make_url

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_PORT = 5432
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
# The query parameters this module reads; none reaches a driver as written.
ADDRESS_PARAMETERS = ("host", "port", "target_session_attrs", "connect_timeout")
MULTI_HOST_EXAMPLE = (
    "postgresql://user:password@host1:5432,host2:5432/db?target_session_attrs=read-write"
)
_WORKS = f"write several hosts as {MULTI_HOST_EXAMPLE}"
# scheme://[user[:password]@]hosts[/db][?query], split as SQLAlchemy splits it.
_AUTHORITY = re.compile(
    r"^(?P<head>[\w+]+://(?:[^:/]*(?::[^@]*)?@)?)(?P<hosts>[^/?]*)(?P<tail>.*)$"
)
_BRACKETED = re.compile(r"^\[(?P<host>[^\]]+)\](?::(?P<port>[^:]*))?$")


@dataclass(frozen=True)
class Host:
    """One server: a name or address (or a Unix socket directory) and its port, if given."""

    name: str
    port: int | None = None

    @property
    def socket_dir(self) -> bool:
        """Whether ``name`` is a Unix socket directory."""
        return self.name.startswith("/")

    def port_or_default(self) -> int:
        """The port, or PostgreSQL's default."""
        return DEFAULT_PORT if self.port is None else self.port

    def authority(self) -> str:
        """``name[:port]`` as a URL's authority spells it (IPv6 in brackets, paths quoted)."""
        name = quote(self.name, safe="") if self.socket_dir else self.name
        if ":" in name:
            name = f"[{name}]"
        return name if self.port is None else f"{name}:{self.port}"


@dataclass(frozen=True)
class PgAddress:
    """A PostgreSQL URL read once: its servers, the session it wants, its connect timeout, and
    the rest of the URL (``url``: no host, port, ``target_session_attrs`` or
    ``connect_timeout`` left in it)."""

    hosts: tuple[Host, ...]
    target_session_attrs: str | None
    connect_timeout_s: float | None
    url: URL

    @property
    def timeout_s(self) -> float | None:
        """The connect timeout per host: the URL's, else the default; ``None`` waits for ever."""
        if self.connect_timeout_s is None:
            return DEFAULT_CONNECT_TIMEOUT_S
        return None if self.connect_timeout_s <= 0 else self.connect_timeout_s

    @property
    def loopback_only(self) -> bool:
        """Whether the URL names hosts and every one is on this machine (loopback)."""
        return bool(self.hosts) and all(host.name in LOOPBACK_HOSTS for host in self.hosts)

    def timeout_or(self, default_s: float | None) -> float | None:
        """The URL's ``connect_timeout`` if it gives one (``None``: wait for ever), else
        ``default_s``."""
        return default_s if self.connect_timeout_s is None else self.timeout_s


def with_libpq_hosts_read(text: str) -> str:
    """``text`` with a libpq multi-host authority (``h1:p1,h2:p2``) rewritten as SQLAlchemy's
    ``host=h1,h2&port=p1,p2``, which :func:`sqlalchemy.engine.make_url` can read; any other
    text unchanged."""
    match = _AUTHORITY.match(text)
    if match is None or "," not in match["hosts"]:
        return text
    hosts = [_host_spec(spec, unquoted=True) for spec in match["hosts"].split(",")]
    head, tail = match["head"], match["tail"]
    if "?" in tail and re.search(r"[?&](host|port)=", tail):
        raise InvalidDatabaseUrlError(
            f"the URL lists hosts both before the database name and in host= or port=: {_WORKS}"
        )
    listed = urlencode(_listed(hosts), safe=",:/[]")
    if not tail.startswith("/"):
        tail = "/" + tail
    return f"{head}{tail}{'&' if '?' in tail else '?'}{listed}"


def pg_address(url: str | URL) -> PgAddress:
    """Read where ``url`` points, from any of the three spellings (:class:`InvalidDatabaseUrlError`
    naming the spelling that works if the URL mixes them or cannot work; never the password)."""
    parsed = make_url(with_libpq_hosts_read(url)) if isinstance(url, str) else url
    query = parsed.query
    listed_hosts = _flat(query.get("host"))
    listed_ports = _flat(query.get("port"))
    if listed_hosts:  # they win over a host before the database name, as in libpq
        hosts = [_host_spec(spec) for spec in listed_hosts]
    elif parsed.host:  # a parsed URL may hold libpq's "h1,h2" (SQLAlchemy reads it as one)
        *others, last = parsed.host.split(",")
        hosts = [*(_host_spec(spec) for spec in others), Host(last, parsed.port)]
    else:
        hosts = []  # libpq's default: the local socket (a port= alone stays in the URL)
    stripped = ADDRESS_PARAMETERS if hosts else ("host", "target_session_attrs", "connect_timeout")
    if listed_ports and hosts:
        if any(host.port is not None for host in hosts):
            raise InvalidDatabaseUrlError(
                f"the URL gives ports both as host:port and in port=: {_WORKS}"
            )
        ports = [_port(text) for text in listed_ports]
        if len(ports) == 1:
            ports = ports * len(hosts)
        if len(ports) != len(hosts):
            raise InvalidDatabaseUrlError(
                f"the URL lists {len(hosts)} hosts and {len(ports)} ports: {_WORKS}"
            )
        hosts = [Host(host.name, port) for host, port in zip(hosts, ports, strict=True)]
    attrs = _single(parsed, "target_session_attrs")
    if attrs is not None and attrs not in SESSION_ATTRS:
        raise InvalidDatabaseUrlError(
            f"target_session_attrs={attrs} is not one of {', '.join(SESSION_ATTRS)}"
        )
    return PgAddress(
        hosts=tuple(hosts),
        target_session_attrs=attrs,
        connect_timeout_s=_timeout(_single(parsed, "connect_timeout")),
        url=parsed.set(host=None, port=None).difference_update_query(stripped),
    )


def engine_url(address: PgAddress) -> URL:
    """The URL for a SQLAlchemy engine (asyncpg or psycopg dialect): one host in the authority,
    several as ``host=h1,h2&port=p1,p2`` (every port given: the asyncpg dialect needs them);
    ``target_session_attrs`` and ``connect_timeout`` kept (outboxkit's engines read them)."""
    url = address.url
    hosts = address.hosts
    if len(hosts) == 1 and not hosts[0].socket_dir:
        url = url.set(host=hosts[0].name, port=hosts[0].port)
    elif len(hosts) == 1:
        url = url.update_query_dict(_listed(list(hosts)))
    elif hosts:
        filled = [Host(host.name, host.port_or_default()) for host in hosts]
        url = url.update_query_dict(_listed(filled))
    extra = {
        "target_session_attrs": address.target_session_attrs,
        "connect_timeout": _timeout_text(address.connect_timeout_s),
    }
    return url.update_query_dict({name: value for name, value in extra.items() if value})


def libpq_uri(address: PgAddress, query: Mapping[str, str] | None = None) -> str:
    """A ``postgresql://`` URI that libpq (psycopg2) and asyncpg both read: the hosts in the
    authority (``h1:p1,h2:p2``), ``target_session_attrs`` kept, ``connect_timeout`` left out
    (asyncpg would send it to the server as a setting: callers pass the timeout themselves),
    and the URL's other parameters, updated with ``query``."""
    url = address.url
    auth = ""
    if url.username is not None:
        auth = quote(url.username, safe="")
        if url.password is not None:
            auth += ":" + quote(str(url.password), safe="")
        auth += "@"
    hosts = ",".join(host.authority() for host in address.hosts)
    params: dict[str, Any] = dict(url.query)
    if address.target_session_attrs is not None:
        params["target_session_attrs"] = address.target_session_attrs
    params.update(query or {})
    text = f"postgresql://{auth}{hosts}/{quote(url.database or '', safe='')}"
    return text + ("?" + urlencode(params, doseq=True) if params else "")


async def connect_in_turn(
    *,
    host: list[str] | str | None = None,
    port: list[int] | int | None = None,
    target_session_attrs: str | None = None,
    timeout: float | None = DEFAULT_CONNECT_TIMEOUT_S,
    **kwargs: Any,
) -> Any:
    """``asyncpg.connect`` trying ``host`` one by one, each bounded by ``timeout`` (asyncpg's
    own bounds all of them together), and keeping the first whose session matches
    ``target_session_attrs``; raises the last host's error if none does. A host that refuses,
    does not answer, is starting or stopping, or does not match is passed over, as asyncpg does.
    """
    import asyncpg

    names = host if isinstance(host, list) else [host]
    ports = port if isinstance(port, list) else [port] * len(names)
    wanted = target_session_attrs or "any"
    rounds = ["standby", "any"] if wanted == "prefer-standby" else [wanted]
    last: BaseException | None = None
    for attrs in rounds:
        for name, number in zip(names, ports, strict=True):
            try:
                return await asyncpg.connect(
                    host=name, port=number, target_session_attrs=attrs, timeout=timeout, **kwargs
                )
            except (
                OSError,
                asyncpg.CannotConnectNowError,
                asyncpg.TargetServerAttributeNotMatched,
            ) as error:
                last = error
    assert last is not None
    raise last


def _listed(hosts: list[Host]) -> dict[str, str]:
    """``host=h1,h2`` and, if any is given, ``port=p1,p2`` (an empty entry: the default)."""
    listed = {"host": ",".join(host.name for host in hosts)}
    if any(host.port is not None for host in hosts):
        listed["port"] = ",".join("" if host.port is None else str(host.port) for host in hosts)
    return listed


def _host_spec(spec: str, *, unquoted: bool = False) -> Host:
    """``name``, ``name:port``, ``[v6]``, ``[v6]:port`` or a socket directory."""
    spec = spec.strip()
    if unquoted:
        spec = unquote(spec)
    if not spec:
        raise InvalidDatabaseUrlError(f"the URL lists an empty host: {_WORKS}")
    if spec.startswith("/"):
        return Host(spec)
    bracketed = _BRACKETED.match(spec)
    if bracketed is not None:
        return Host(bracketed["host"], _port(bracketed["port"]))
    if spec.count(":") > 1:
        return Host(spec)  # a bare IPv6 address
    name, _, port = spec.partition(":")
    return Host(name, _port(port))


def _port(text: str | None) -> int | None:
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidDatabaseUrlError(f"port {text!r} is not a port number: {_WORKS}")
    return int(text)


def _flat(value: str | tuple[str, ...] | None) -> list[str]:
    """A query value, repeated or comma-separated, as one list."""
    if value is None:
        return []
    values = (value,) if isinstance(value, str) else value
    return [item for text in values for item in text.split(",")]


def _single(url: URL, name: str) -> str | None:
    value = url.query.get(name)
    if isinstance(value, tuple):
        raise InvalidDatabaseUrlError(f"the URL sets {name} more than once")
    return value


def _timeout(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise InvalidDatabaseUrlError(f"connect_timeout={text} is not a number of seconds")
    return seconds


def _timeout_text(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return str(int(seconds)) if seconds == int(seconds) else str(seconds)
