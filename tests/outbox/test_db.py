"""Driver selection and TLS defaults of outboxkit's engines (pure URL logic, no server)."""

import pytest
from outboxkit.outbox.db import async_url, sync_url


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_server_gets_no_tls_from_either_driver(host: str) -> None:
    assert async_url(f"postgresql://u:p@{host}:5432/app").endswith("/app?ssl=disable")
    assert sync_url(f"postgresql://u:p@{host}:5432/app").endswith("/app?sslmode=disable")


def test_remote_server_keeps_the_driver_default_and_explicit_choices_win() -> None:
    assert (
        async_url("postgresql://u:p@db.internal/app") == "postgresql+asyncpg://u:p@db.internal/app"
    )
    assert async_url("postgresql://u:p@127.0.0.1/app?ssl=require").endswith("?ssl=require")
    assert sync_url("postgresql://u:p@127.0.0.1/app?sslmode=verify-full").endswith(
        "?sslmode=verify-full"
    )


def test_sqlite_urls_are_untouched_and_other_backends_refused() -> None:
    assert sync_url("sqlite:///outbox.db") == "sqlite:///outbox.db"
    assert async_url("sqlite:///outbox.db") == "sqlite+aiosqlite:///outbox.db"
    with pytest.raises(ValueError, match="unsupported database URL"):
        sync_url("mysql://u:p@127.0.0.1/app")
