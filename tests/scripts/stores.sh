#!/usr/bin/env bash
# Starts every store the tests and benchmarks run against, each installed on
# first use: moto and ministack (s3://, two S3s written apart), Azurite
# (azure://), fake-gcs-server (gs://), a throwaway PostgreSQL cluster
# (postgresql:// and the legacy Meltano guard) with PgBouncer in front of it,
# two etcd servers (etcd://, one with authentication). Sourced, never run:
#   source tests/scripts/stores.sh && stores_start   # exports RUNLOCK_TEST_*
# stores_start sets an EXIT trap that stops them all (and runs STORES_ON_EXIT).
stores_dir=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=moto.sh
source "$stores_dir/moto.sh"
# shellcheck source=ministack.sh
source "$stores_dir/ministack.sh"
# shellcheck source=azurite.sh
source "$stores_dir/azurite.sh"
# shellcheck source=fake_gcs.sh
source "$stores_dir/fake_gcs.sh"
# shellcheck source=postgres.sh
source "$stores_dir/postgres.sh"
# shellcheck source=pgbouncer.sh
source "$stores_dir/pgbouncer.sh"
# shellcheck source=etcd.sh
source "$stores_dir/etcd.sh"

stores_start() {
    trap 'moto_stop; ministack_stop; azurite_stop; fake_gcs_stop; pgbouncer_stop; pg_stop; etcd_stop; eval "${STORES_ON_EXIT:-}"' EXIT
    moto_start     # RUNLOCK_TEST_S3_ENDPOINT, RUNLOCK_TEST_MOTO_PID, RUNLOCK_TEST_PYTHON
    ministack_start # RUNLOCK_TEST_MINISTACK_ENDPOINT, _PID, _PYTHON
    azurite_start  # RUNLOCK_TEST_AZURE_ENDPOINT, _CONNECTION_STRING, _PYTHON
    fake_gcs_start # RUNLOCK_TEST_GCS_ENDPOINT, RUNLOCK_TEST_GCS_BIN, RUNLOCK_TEST_GCS_PID
    pg_start       # RUNLOCK_TEST_PG_URI
    pgbouncer_start # RUNLOCK_TEST_PGBOUNCER_URI, in front of that server
    etcd_start     # RUNLOCK_TEST_ETCD_ENDPOINT, RUNLOCK_TEST_ETCD_AUTH_ENDPOINT, …
}
