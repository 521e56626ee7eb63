#!/usr/bin/env bash
# Installs PostgreSQL from Debian's packages if needed, starts the cluster, and gives the
# postgres user a password for TCP logins on 127.0.0.1. Idempotent. Prints the URL to use.
set -euo pipefail
# Only the URL goes to stdout (callers capture it); everything the tools print goes to stderr,
# e.g. pg_ctlcluster's "Removed stale pid file." after an unclean shutdown.
exec 3>&1 1>&2
PG_PASSWORD="${OUTBOXKIT_PG_PASSWORD:-postgres}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi
read -r VERSION CLUSTER PORT STATUS _ < <(pg_lsclusters --no-header | head -n 1)
if [ -z "${VERSION:-}" ]; then
  VERSION=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
  $SUDO pg_createcluster "$VERSION" main >/dev/null
  read -r VERSION CLUSTER PORT STATUS _ < <(pg_lsclusters --no-header | head -n 1)
fi
# More connections than the default 100: tests run several relays and consumers at once.
# wal_level=logical for `outboxkit relay --mode logical` (a replication slot per outbox
# database); each test database of that mode holds one slot for its lifetime.
SETTINGS="max_connections=300 wal_level=logical max_replication_slots=64 max_wal_senders=64"
# WAL sized for the retention bench's 5,000 events/s (about 20 MB/s of WAL): with the default
# max_wal_size of 1 GB a checkpoint starts every 22-28 s, after which every page a write touches
# first is logged whole (docs/operations.md#the-servers-wal-settings). lz4 needs PostgreSQL 15.
WAL_COMPRESSION=on
[ "${VERSION%%.*}" -ge 15 ] && WAL_COMPRESSION=lz4
SETTINGS="$SETTINGS max_wal_size=8GB wal_compression=$WAL_COMPRESSION"
CHANGED=""
for setting in $SETTINGS; do
  name="${setting%%=*}"; value="${setting#*=}"
  if [ "$($SUDO pg_conftool "$VERSION" "$CLUSTER" show "$name" 2>/dev/null | sed 's/.*= *//; s/'"'"'//g')" != "$value" ]; then
    $SUDO pg_conftool "$VERSION" "$CLUSTER" set "$name" "$value" >/dev/null
    CHANGED=1
  fi
done
if [ "$STATUS" = "online" ] && [ -n "$CHANGED" ]; then
  # These settings take effect at a restart only.
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$CLUSTER" restart 3>&-
fi
if [ "$STATUS" != "online" ]; then
  # 3>&- keeps the daemon from holding the caller's capture pipe open. One retry: after an
  # unclean stop the first start can trip over a socket lock file the dead server left behind.
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$CLUSTER" start 3>&- \
    || { sleep 2; $SUDO pg_ctlcluster --skip-systemctl-redirect "$VERSION" "$CLUSTER" start 3>&-; }
fi
for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PORT" && break
  sleep 0.5
done
SQL="ALTER USER postgres PASSWORD '${PG_PASSWORD}'"
if [ -z "$SUDO" ]; then
  su postgres -c "psql -q -p $PORT -c \"$SQL\"" >/dev/null
else
  sudo -u postgres psql -q -p "$PORT" -c "$SQL" >/dev/null
fi
echo "postgresql://postgres:${PG_PASSWORD}@127.0.0.1:${PORT}/postgres" >&3
