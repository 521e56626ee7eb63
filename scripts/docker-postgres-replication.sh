#!/usr/bin/env bash
# Run once by the postgres image when it creates its cluster (docker-compose.yml mounts it into
# /docker-entrypoint-initdb.d): replication connections from other hosts, with a password like
# the image's own line for ordinary ones, for `outboxkit relay --mode logical`'s stream reader.
set -euo pipefail
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
