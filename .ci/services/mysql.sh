# MariaDB for the tests of the MySQL / MariaDB store (sourced by .ci/run,
# under `set -euo pipefail`, with a `cleanup` array of stop commands).
#
# Uses the server on 127.0.0.1:3306 (root without a password, database
# `test`) when it answers; otherwise starts a throwaway server of the
# distribution's mariadb-server (installed if missing) with its own datadir
# (mariadb-install-db) on a free loopback port, stopped and removed at
# exit. Either way the server binaries must be installed: the restart
# tests start servers of their own.
# Exports WORKLEASE_TEST_MYSQL_URL. Also starts, always, a throwaway server
# whose global transaction isolation is SERIALIZABLE (and sql_mode ANSI,
# NO_BACKSLASH_ESCAPES) and exports its URL as
# WORKLEASE_TEST_MYSQL_SERIALIZABLE_URL. Quiet unless something fails.

worklease_mysql_answers() { # port
    mariadb --protocol=tcp -h 127.0.0.1 -P "$1" -u root -N -e 'SELECT 1' >/dev/null 2>&1
}

worklease_mysql_service() {
    if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ] \
        || ! command -v mariadb-install-db >/dev/null 2>&1 || ! command -v mariadb >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq mariadb-server mariadb-client >/dev/null
    fi

    if worklease_mysql_answers 3306; then
        mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
        export WORKLEASE_TEST_MYSQL_URL="mysql://root@127.0.0.1:3306/test"
        # The tests name their tables wl_test_*: drop this run's leftovers
        # (tables and their procedures) at exit.
        cleanup+=("worklease_mysql_drop_test_tables 3306")
        return 0
    fi

    worklease_mysql_throwaway WORKLEASE_TEST_MYSQL_URL
}

# Starts a throwaway server of the installed mariadbd with its own datadir
# on a free loopback port in 13306-13406, stopped and removed at exit;
# exports its URL (database `test`) as the variable named $1. Further
# arguments go to mariadbd.
worklease_mysql_throwaway() { # variable [mariadbd options...]
    local var="$1"
    shift
    # A free loopback port: nothing accepts connections on it.
    local port=""
    local candidate
    for candidate in $(seq 13306 13406); do
        if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
            port="$candidate"
            break
        fi
    done
    if [ -z "$port" ]; then
        echo "mysql.sh: no free port in 13306-13406 for a test MariaDB server" >&2
        return 1
    fi

    local dir
    dir="$(mktemp -d -t worklease-mariadb.XXXXXX)"
    local user_args=()
    if [ "$(id -u)" = 0 ]; then
        chown mysql: "$dir"
        user_args=(--user=mysql)
    fi
    mariadb-install-db --no-defaults --datadir="$dir/data" "${user_args[@]}" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 || {
        echo "mysql.sh: mariadb-install-db failed:" >&2
        cat "$dir/install.log" >&2
        return 1
    }
    local mariadbd
    mariadbd="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
    "$mariadbd" --no-defaults --datadir="$dir/data" --socket="$dir/sock" \
        --pid-file="$dir/pid" --log-error="$dir/log" --port="$port" \
        --bind-address=127.0.0.1 "${user_args[@]}" "$@" >/dev/null 2>&1 &
    cleanup+=("kill $! 2>/dev/null; for _ in \$(seq 1 300); do kill -0 $! 2>/dev/null || break; sleep 0.1; done; rm -rf '$dir'")

    # mariadbd says nothing when it listens: wait until it answers.
    local tries
    for tries in $(seq 1 300); do
        if worklease_mysql_answers "$port"; then
            mariadb --protocol=tcp -h 127.0.0.1 -P "$port" -u root -e 'CREATE DATABASE test'
            export "$var=mysql://root@127.0.0.1:$port/test"
            return 0
        fi
        sleep 0.1
    done
    echo "mysql.sh: the test MariaDB server on port $port did not answer; its log:" >&2
    cat "$dir/log" >&2 || true
    return 1
}

# Drops the tables and procedures the tests made (wl_test_*) on the shared
# server.
worklease_mysql_drop_test_tables() { # port
    local sql
    sql="$(mariadb --protocol=tcp -h 127.0.0.1 -P "$1" -u root -N test -e "
        SELECT CONCAT('DROP TABLE IF EXISTS \`', TABLE_NAME, '\`;') FROM information_schema.TABLES
            WHERE TABLE_SCHEMA = 'test' AND TABLE_NAME LIKE 'wl\\_test\\_%'
        UNION ALL
        SELECT CONCAT('DROP PROCEDURE IF EXISTS \`', ROUTINE_NAME, '\`;') FROM information_schema.ROUTINES
            WHERE ROUTINE_SCHEMA = 'test' AND ROUTINE_NAME LIKE 'wl\\_test\\_%'")" || return 0
    [ -z "$sql" ] || mariadb --protocol=tcp -h 127.0.0.1 -P "$1" -u root test -e "$sql"
}

worklease_mysql_service
# A server whose global isolation is SERIALIZABLE and whose sql_mode
# changes how SQL is read (ANSI: double quotes name identifiers, || joins
# strings; no backslash escapes), as a DBA may set them: the store must
# not depend on either (tests/common/sql_isolation.rs).
worklease_mysql_throwaway WORKLEASE_TEST_MYSQL_SERIALIZABLE_URL \
    --transaction-isolation=SERIALIZABLE --sql-mode=ANSI,NO_BACKSLASH_ESCAPES
unset -f worklease_mysql_service worklease_mysql_throwaway
