# Two implementations of DynamoDB's API for the DynamoDB store's tests;
# sourced by .ci/run (set -euo pipefail, a `cleanup` array of commands run
# at exit):
#
# * dynalite (the npm package; DynamoDB's API over LevelDB), installed
#   under ${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}/dynalite (npm,
#   with Node.js and npm from apt when missing) and reused after. Uses a
#   dynalite already answering on 127.0.0.1:4567 (its default port);
#   otherwise starts one on a free loopback port over a LevelDB directory
#   of its own, stopped and removed at exit.
# * moto's DynamoDB, from moto's virtual environment (lib/moto-venv.sh),
#   always a server of its own on a free loopback port, stopped at exit:
#   moto's usual server handles requests on many threads and checks a
#   DynamoDB condition without a lock, so two conditional writes of one
#   item can both pass; lib/moto-serialized.py answers one request at a
#   time, as atomic as DynamoDB's conditional writes.
#
# Exports WORKLEASE_TEST_DYNAMODB_URL (dynalite) and
# WORKLEASE_TEST_DYNAMODB_MOTO_URL (moto), each naming a table unique to
# this run (the tests make it: `create=true`), and, unless already set,
# dummy AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (neither server checks
# them).

# A free loopback port in FIRST..LAST, or fails.
worklease_free_port() {
    local candidate
    for candidate in $(seq "$1" "$2"); do
        if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "dynamodb.sh: no free loopback port in $1-$2" >&2
    return 1
}

# Waits until `curl URL` prints a line matching PATTERN, while PID lives.
worklease_await_http() {
    local url="$1" pattern="$2" pid="$3" log="$4" tries
    for tries in $(seq 1 300); do
        if curl -s "$url" 2>/dev/null | grep -q "$pattern"; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null || [ "$tries" = 300 ]; then
            echo "dynamodb.sh: the server at $url did not answer; its log:" >&2
            cat "$log" >&2 || true
            return 1
        fi
        sleep 0.1
    done
}

worklease_dynamodb_service() {
    local cache="${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}"
    local npm_dir="$cache/dynalite"
    local region="us-east-1"
    local table dir port

    if ! command -v curl >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "dynalite: installing curl, nodejs and npm (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq curl nodejs npm >/dev/null
    fi
    if [ ! -f "$npm_dir/node_modules/dynalite/package.json" ]; then
        echo "dynalite: npm install dynalite@3 into $npm_dir"
        mkdir -p "$npm_dir"
        (cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error dynalite@3)
    fi

    # dynalite answers a bare GET with "healthy: dynamodb.<region>...".
    if curl -s "http://127.0.0.1:4567/" 2>/dev/null | grep -q '^healthy: dynamodb'; then
        port=4567
        echo "dynalite: using the server on 127.0.0.1:4567"
    else
        port="$(worklease_free_port 14567 14667)"
        dir="$(mktemp -d -t worklease-dynalite.XXXXXX)"
        # Its command line listens on every interface: the library call
        # listens on loopback only.
        node -e 'require(process.argv[1])({ path: process.argv[2] }).listen(+process.argv[3], "127.0.0.1")' \
            "$npm_dir/node_modules/dynalite" "$dir/db" "$port" >"$dir/dynalite.log" 2>&1 &
        echo $! >"$dir/dynalite.pid"
        cleanup+=("kill \"\$(cat '$dir/dynalite.pid')\" 2>/dev/null; rm -rf '$dir'")
        worklease_await_http "http://127.0.0.1:$port/" '^healthy: dynamodb' \
            "$(cat "$dir/dynalite.pid")" "$dir/dynalite.log"
        echo "dynalite: started a throwaway server on 127.0.0.1:$port"
    fi
    table="worklease-ci-$(date +%s)-$$"
    export WORKLEASE_TEST_DYNAMODB_URL="dynamodb://$table?endpoint=http://127.0.0.1:$port&region=$region&create=true"

    local venv="$cache/moto-venv"
    # shellcheck source=lib/moto-venv.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib/moto-venv.sh"
    worklease_moto_venv "$venv"
    port="$(worklease_free_port 15101 15200)"
    dir="$(mktemp -d -t worklease-moto-dynamodb.XXXXXX)"
    "$venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/lib/moto-serialized.py" 127.0.0.1 "$port" \
        >"$dir/moto.log" 2>&1 &
    echo $! >"$dir/moto.pid"
    cleanup+=("kill \"\$(cat '$dir/moto.pid')\" 2>/dev/null; rm -rf '$dir'")
    worklease_await_http "http://127.0.0.1:$port/moto-api/" '' "$(cat "$dir/moto.pid")" "$dir/moto.log"
    echo "moto (DynamoDB, one request at a time): started a throwaway server on 127.0.0.1:$port"
    export WORKLEASE_TEST_DYNAMODB_MOTO_URL="dynamodb://$table?endpoint=http://127.0.0.1:$port&region=$region&create=true"

    export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-worklease-test}"
    export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-worklease-test}"
}

worklease_dynamodb_service
unset -f worklease_dynamodb_service worklease_free_port worklease_await_http worklease_moto_venv
