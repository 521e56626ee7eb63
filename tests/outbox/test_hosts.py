"""Reading several PostgreSQL hosts from every spelling users write, and writing them back for
each driver (outbox/hosts.py); no server needed."""

from __future__ import annotations

import pytest
from outboxkit.outbox.db import async_url, parse_url, sync_url
from outboxkit.outbox.errors import InvalidDatabaseUrlError
from outboxkit.outbox.hosts import Host, pg_address
from outboxkit.outbox.notify import listen_dsn
from sqlalchemy.engine import make_url

FORMS = [
    "postgresql://u:s3cret@h1:5432,h2:5433/db?target_session_attrs=read-write",
    "postgresql://u:s3cret@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write",
    "postgresql://u:s3cret@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
    "postgresql+asyncpg://u:s3cret@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
]


@pytest.mark.parametrize("url", FORMS)
def test_every_form_reads_as_the_same_hosts_and_renders_for_each_driver(url: str) -> None:
    address = pg_address(url)
    assert address.hosts == (Host("h1", 5432), Host("h2", 5433))
    assert address.target_session_attrs == "read-write"
    assert address.url.database == "db"
    assert async_url(url) == (
        "postgresql+asyncpg://u:s3cret@/db?host=h1%2Ch2&port=5432%2C5433"
        "&target_session_attrs=read-write"
    )
    assert sync_url(url).startswith("postgresql+psycopg://u:s3cret@/db?host=h1%2Ch2&port=")
    expected = "postgresql://u:s3cret@h1:5432,h2:5433/db?target_session_attrs=read-write"
    assert listen_dsn(url) == listen_dsn(async_url(url)) == expected


def test_ports_left_out_default_and_a_connect_timeout_is_kept_for_the_drivers() -> None:
    url = "postgresql://u:p@h1,[2001:db8::1]:6000/db?connect_timeout=3&sslmode=require"
    address = pg_address(url)
    assert address.hosts == (Host("h1"), Host("2001:db8::1", 6000))
    assert address.timeout_s == 3
    assert "connect_timeout=3" in async_url(url)
    assert "port=5432%2C6000" in async_url(url)  # asyncpg's dialect needs every port
    # asyncpg would send connect_timeout to the server as a setting: callers pass it
    assert listen_dsn(url) == "postgresql://u:p@h1,[2001:db8::1]:6000/db?sslmode=require"
    assert pg_address("postgresql://u:p@h/db?connect_timeout=0").timeout_s is None
    assert pg_address("postgresql://u:p@h/db").timeout_s == 10


def test_a_parsed_url_holding_libpq_hosts_reads_them_too() -> None:
    parsed = make_url("postgresql+asyncpg://u:p@h1,h2:5433/db")  # SQLAlchemy's one "host"
    assert pg_address(parsed).hosts == (Host("h1"), Host("h2", 5433))
    assert listen_dsn(parsed) == "postgresql://u:p@h1,h2:5433/db"


def test_one_host_and_local_sockets_keep_their_usual_spelling() -> None:
    assert async_url("postgresql://u:p@db.internal:5433/app") == (
        "postgresql+asyncpg://u:p@db.internal:5433/app"
    )
    assert sync_url("postgresql://u:p@/app?host=/run/postgresql") == (
        "postgresql+psycopg://u:p@/app?host=%2Frun%2Fpostgresql"
    )
    # Loopback hosts, however spelled, get TLS off as a single loopback host does.
    assert async_url("postgresql://u:p@127.0.0.1:5432,localhost:5433/app").endswith(
        "sslmode=disable"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u:s3cret@/db?host=h1:5432&host=h2&port=5433", "both as host:port and"),
        ("postgresql://u:s3cret@/db?host=h1,h2,h3&port=1,2", "3 hosts and 2 ports"),
        ("postgresql://u:s3cret@h1:x,h2/db", "port 'x' is not a port number"),
        ("postgresql://u:s3cret@h1,h2/db?host=h3", "both before the database name and in"),
        ("postgresql://u:s3cret@h1,,h2/db", "an empty host"),
        ("postgresql://u:s3cret@h1,h2/db?target_session_attrs=rw", "is not one of any"),
        ("postgresql://u:s3cret@h/db?connect_timeout=soon", "connect_timeout=soon is not"),
    ],
)
def test_a_form_that_cannot_work_is_one_line_naming_the_form_that_does(url: str, says: str) -> None:
    with pytest.raises(InvalidDatabaseUrlError) as refused:
        async_url(url)
    message = str(refused.value)
    assert says in message
    assert "\n" not in message and "s3cret" not in message
    if "port" in says or "host" in says:
        assert "postgresql://user:password@host1:5432,host2:5432/db?target_session_attrs" in message


def test_text_that_is_no_url_names_the_multi_host_form_too() -> None:
    with pytest.raises(InvalidDatabaseUrlError, match="host1:5432,host2:5432") as refused:
        parse_url("postgresql://u:s3cret@h1:5432:9/db")
    assert "s3cret" not in str(refused.value)
