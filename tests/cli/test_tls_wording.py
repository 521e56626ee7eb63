"""A PostgreSQL TLS failure is one wording in every command (issue 23, item 11): ``migrate``
(psycopg underneath), ``relay --drain`` (a ping through ops) and ``workflows list`` (asyncpg's
``ssl`` error as it is) print the same line with exit code 2, against a real TLS-only server
and a root certificate that did not sign its certificate."""

from __future__ import annotations

import pytest
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.db_failures import tls_failure
from outboxkit.testing.postgres import TlsCluster
from sqlalchemy.exc import DBAPIError

from tests.support.ops import cli_process

LINE = (
    "outboxkit: error: TLS to the database failed: certificate verify failed: "
    "unable to get local issuer certificate"
)


def test_three_commands_word_a_tls_failure_identically(
    tls_pg: TlsCluster, kafka_bootstrap: str
) -> None:
    url = f"{tls_pg.url}?sslmode=verify-full&sslrootcert={tls_pg.wrong_ca_file}"
    runs = {
        "migrate": cli_process("migrate", "--db-url", url),
        "relay --drain": cli_process(
            "relay", "--drain", "--db-url", url, "--bootstrap", kafka_bootstrap
        ),
        "workflows list": cli_process("workflows", "list", "--db-url", url),
    }
    lines = {name: (done.code, done.error_line()) for name, done in runs.items()}
    assert set(lines.values()) == {(2, LINE)}, lines


def test_libpq_text_of_psycopg_gets_the_same_prefix(tls_pg: TlsCluster) -> None:
    engine = make_engine(f"{tls_pg.url}?sslmode=verify-full&sslrootcert={tls_pg.wrong_ca_file}")
    with pytest.raises(DBAPIError) as refused:
        engine.connect().close()
    engine.dispose()
    assert tls_failure(refused.value) == "TLS to the database failed: certificate verify failed"
