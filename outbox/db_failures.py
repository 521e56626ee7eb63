"""The one wording of a PostgreSQL TLS failure, whichever driver or command met it.

asyncpg raises :class:`ssl.SSLError` as it is (wrapped by SQLAlchemy or not), psycopg and
psycopg2 report libpq's text (``SSL error: certificate verify failed``); every command that
describes a database failure (``cli/errors.py``, ``ops/access.py``) asks :func:`tls_failure`
first, so ``migrate``, ``relay --drain``, ``workflows list`` and ``status`` print one line.
"""

from __future__ import annotations

import re
import ssl

from sqlalchemy.exc import DBAPIError

PREFIX = "TLS to the database failed: "
# libpq's own words (psycopg, psycopg2), after "connection to server at ... failed: "
_LIBPQ = re.compile(
    r"SSL error: (?P<ssl>[^\n]+)"
    r"|(?P<mismatch>server certificate for \"[^\"]*\" does not match host name \"[^\"]*\")"
    r"|(?P<refused>server does not support SSL, but SSL was required)"
)


def tls_failure(error: BaseException) -> str | None:
    """``TLS to the database failed: <why>`` when ``error`` (or what it wraps) is a TLS
    failure connecting to PostgreSQL; ``None`` otherwise. No secret is part of the line."""
    for link in _chain(error):
        if isinstance(link, ssl.SSLCertVerificationError):
            return f"{PREFIX}certificate verify failed: {link.verify_message or link.reason}"
        if isinstance(link, ssl.SSLError):
            return PREFIX + str(link.reason or link)
        if isinstance(link, ConnectionError) and "rejected SSL upgrade" in str(link):
            return PREFIX + "the server does not support TLS, but the URL's sslmode requires it"
        found = _LIBPQ.search(str(link)) if type(link).__module__.startswith("psycopg") else None
        if found is not None:
            if found.group("refused"):
                return PREFIX + "the server does not support TLS, but the URL's sslmode requires it"
            return PREFIX + (found.group("ssl") or found.group("mismatch")).strip()
    return None


def _chain(error: BaseException) -> list[BaseException]:
    """``error``, the driver error it wraps, and its causes (a few links at most)."""
    links: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in links and len(links) < 6:
        links.append(current)
        if isinstance(current, DBAPIError) and isinstance(current.orig, BaseException):
            links.append(current.orig)
        current = current.__cause__ or current.__context__
    return links
