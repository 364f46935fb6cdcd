# PostgreSQL for the postgres store's tests; sourced by .ci/run (set -euo
# pipefail, a `cleanup` array of commands run at exit).
#
# Uses the server on 127.0.0.1:5432 (trust auth, database `test`) when it
# answers; otherwise installs the server if its binaries are missing and
# starts a throwaway cluster (initdb -A trust, as the postgres user when run
# as root) on a free loopback port, stopped and removed at exit. Exports
# WORKLEASE_TEST_POSTGRES_URL for the tests either way.

pg_shared_url="postgres://postgres@127.0.0.1:5432/test"
if command -v pg_isready >/dev/null 2>&1 && command -v psql >/dev/null 2>&1 \
    && pg_isready -q -h 127.0.0.1 -p 5432 \
    && psql -h 127.0.0.1 -p 5432 -U postgres -d test -Atqc 'select 1' >/dev/null 2>&1; then
    export WORKLEASE_TEST_POSTGRES_URL="$pg_shared_url"
    echo "postgres: using the server on 127.0.0.1:5432"
else
    pg_bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
    pg_bin=$(pg_bin_dir || true)
    if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
        echo "postgres: installing the server (apt-get install postgresql)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        pg_bin=$(pg_bin_dir)
    fi
    pg_as_owner() {
        if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
    }
    pg_port=""
    for p in $(seq 55432 55532); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then pg_port=$p; break; fi
    done
    [ -n "$pg_port" ] || { echo "postgres: no free loopback port in 55432-55532" >&2; exit 1; }
    pg_dir=$(mktemp -d /tmp/worklease-ci-pg.XXXXXX)
    if [ "$(id -u)" = 0 ]; then chown postgres: "$pg_dir"; fi
    pg_as_owner "$pg_bin/initdb" -A trust -U postgres -E UTF8 -D "$pg_dir/data" >/dev/null
    pg_as_owner "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w \
        -o "-p $pg_port -c listen_addresses=127.0.0.1 -k $pg_dir" start >/dev/null
    cleanup+=("$(printf '%q ' pg_as_owner "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop) >/dev/null; rm -rf $(printf '%q' "$pg_dir")")
    "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -t 30
    "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -Atqc 'CREATE DATABASE test' >/dev/null
    export WORKLEASE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$pg_port/test"
    echo "postgres: started a throwaway cluster on 127.0.0.1:$pg_port"
fi

# The tests give every run its own tables (wl_test_*); on a shared server,
# drop this CI run's leftovers at exit (tables and their fencing sequences).
if [ "${WORKLEASE_TEST_POSTGRES_URL}" = "$pg_shared_url" ]; then
    cleanup+=("psql -h 127.0.0.1 -p 5432 -U postgres -d test -Atqc \"DO \\\$\\\$ DECLARE r record; BEGIN FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname LIKE 'wl\\\\_test\\\\_%' AND c.relkind IN ('r','S') ORDER BY c.relkind DESC LOOP EXECUTE format('DROP %s IF EXISTS %I CASCADE', CASE r.relkind WHEN 'r' THEN 'TABLE' ELSE 'SEQUENCE' END, r.relname); END LOOP; END \\\$\\\$\" >/dev/null")
fi
# The SERIALIZABLE databases the tests create (wl_test_serializable_*,
# tests/common/postgres.rs): dropped at exit on a shared server.
if [ "${WORKLEASE_TEST_POSTGRES_URL}" = "$pg_shared_url" ]; then
    cleanup+=("psql -h 127.0.0.1 -p 5432 -U postgres -d test -Atqc \"SELECT datname FROM pg_database WHERE datname LIKE 'wl\\\\_test\\\\_serializable\\\\_%'\" | while read -r db; do psql -h 127.0.0.1 -p 5432 -U postgres -d test -Atqc \"DROP DATABASE IF EXISTS \\\"\$db\\\" WITH (FORCE)\" >/dev/null; done")
fi
