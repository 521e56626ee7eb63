"""One real Patroni cluster (etcd, two PostgreSQL nodes, HAProxy) per test module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from outboxkit.migrations.runner import upgrade
from outboxkit.testing.patroni import PatroniCluster, missing_tools, patroni_cluster


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[PatroniCluster]:
    """A Patroni cluster of the module's own, killed and removed after its last test."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"a Patroni cluster needs {', '.join(missing)} (scripts/install.sh)")
    with patroni_cluster() as cluster:
        yield cluster
    print(f"\npatroni timings (s): {cluster.timings}")


@pytest.fixture
def ha_db(ha_cluster: PatroniCluster) -> str:
    """A fresh, migrated database on the cluster (healthy again after the last test's
    faults); its URL through HAProxy."""
    ha_cluster.wait_healthy()
    name = f"ha_{uuid.uuid4().hex[:10]}"
    url = ha_cluster.create_database(name)
    upgrade(url)
    return url
