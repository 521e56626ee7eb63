"""Driver selection and TLS parameters of outboxkit's engines (pure URL logic, no server)."""

import ssl
from pathlib import Path

import pytest
from outboxkit.outbox.db import PgTls, async_url, pg_tls, sync_url
from outboxkit.outbox.errors import InvalidDatabaseUrlError
from outboxkit.outbox.notify import listen_dsn
from outboxkit.testing.certificates import issue_certificate, make_ca
from sqlalchemy.engine import make_url


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_server_gets_no_tls_from_either_driver(host: str) -> None:
    assert async_url(f"postgresql://u:p@{host}:5432/app").endswith("/app?sslmode=disable")
    assert sync_url(f"postgresql://u:p@{host}:5432/app").endswith("/app?sslmode=disable")
    assert pg_tls(f"postgresql://u:p@{host}/app").asyncpg_ssl() == "disable"


def test_remote_server_keeps_the_driver_default_and_explicit_choices_win() -> None:
    assert (
        async_url("postgresql://u:p@db.internal/app") == "postgresql+asyncpg://u:p@db.internal/app"
    )
    assert pg_tls("postgresql://u:p@db.internal/app").asyncpg_ssl() is None
    assert async_url("postgresql://u:p@127.0.0.1/app?ssl=require").endswith("?sslmode=require")
    assert sync_url("postgresql://u:p@127.0.0.1/app?sslmode=verify-full").endswith(
        "?sslmode=verify-full"
    )


def test_asyncpg_spelling_is_read_as_sslmode_for_psycopg_and_listen() -> None:
    url = "postgresql+asyncpg://u:p@db.internal/app?ssl=verify-full"
    assert sync_url(url) == "postgresql+psycopg://u:p@db.internal/app?sslmode=verify-full"
    assert listen_dsn(url) == "postgresql://u:p@db.internal/app?sslmode=verify-full"
    assert pg_tls("postgresql://h/app?ssl=true").mode == "require"


def test_files_become_an_ssl_context_for_asyncpg_following_libpq(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = issue_certificate(ca, tmp_path, "client", server=False)
    base = f"postgresql://u@db.internal/app?sslrootcert={ca.cert_file}"
    full = pg_tls(f"{base}&sslmode=verify-full&sslcert={cert}&sslkey={key}").asyncpg_ssl()
    assert isinstance(full, ssl.SSLContext)
    assert full.check_hostname and full.verify_mode is ssl.CERT_REQUIRED
    # libpq: require with a root certificate verifies the chain (as verify-ca), not the name
    require = pg_tls(f"{base}&sslmode=require").asyncpg_ssl()
    assert isinstance(require, ssl.SSLContext)
    assert not require.check_hostname and require.verify_mode is ssl.CERT_REQUIRED
    # the files stay libpq parameters for psycopg
    assert make_url(sync_url(f"{base}&sslmode=verify-ca")).query == {
        "sslmode": "verify-ca",
        "sslrootcert": str(ca.cert_file),
    }


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslmode=strict", "sslmode=strict is not one of disable, allow"),
        ("sslmode=require&ssl=disable", "both sslmode=require and ssl=disable"),
        ("sslmode=verify-full&sslrootcert=/nonexistent/ca.crt", "sslrootcert file /nonexistent"),
        ("sslmode=require&sslkey=/etc/hostname", "sslkey needs sslcert"),
        ("sslmode=require&sslmode=disable", "sets sslmode more than once"),
    ],
)
def test_bad_tls_parameters_are_one_line_errors_for_every_driver(query: str, message: str) -> None:
    for translate in (sync_url, async_url):
        with pytest.raises(InvalidDatabaseUrlError, match=message):
            translate(f"postgresql://u:p@db.internal/app?{query}")


def test_nothing_about_tls_is_the_driver_default_off_loopback() -> None:
    assert pg_tls("postgresql://u:p@db.internal/app") == PgTls()


def test_sqlite_urls_are_untouched_and_other_backends_refused() -> None:
    assert sync_url("sqlite:///outbox.db") == "sqlite:///outbox.db"
    assert async_url("sqlite:///outbox.db") == "sqlite+aiosqlite:///outbox.db"
    with pytest.raises(ValueError, match="unsupported database URL"):
        sync_url("mysql://u:p@127.0.0.1/app")
