# Redis for the tests of the Redis store (sourced by .ci/run, under
# `set -euo pipefail`, with a `cleanup` array of stop commands).
#
# Uses the server on 127.0.0.1:6379 when it answers; otherwise starts a
# throwaway one (no persistence) on a free loopback port and registers its
# stop. Either way `redis-server` must be installed: the restart tests start
# servers of their own. Exports WORKLEASE_TEST_REDIS_URL. Quiet unless
# something fails. The tests of tests/redis_topologies.rs (TLS, ACL users,
# Sentinel failover) start their own servers and sentinels from the same
# binary (`redis-server FILE --sentinel`): no redis-sentinel package needed.

worklease_redis_service() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq redis-server >/dev/null
    fi

    if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || true)" = "PONG" ]; then
        export WORKLEASE_TEST_REDIS_URL="redis://127.0.0.1:6379/0"
        return 0
    fi

    # A free loopback port: nothing accepts connections on it.
    local port=""
    local candidate
    for candidate in $(seq 16379 16479); do
        if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
            port="$candidate"
            break
        fi
    done
    if [ -z "$port" ]; then
        echo "redis.sh: no free port in 16379-16479 for a test Redis server" >&2
        return 1
    fi

    local dir
    dir="$(mktemp -d -t worklease-redis.XXXXXX)"
    redis-server --save "" --appendonly no --daemonize yes \
        --bind 127.0.0.1 --port "$port" \
        --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
    cleanup+=("kill \"\$(cat '$dir/redis.pid')\" 2>/dev/null; rm -rf '$dir'")

    # --daemonize returns before the server listens: wait until it answers.
    local tries
    for tries in $(seq 1 100); do
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)" = "PONG" ]; then
            export WORKLEASE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
            return 0
        fi
        sleep 0.1
    done
    echo "redis.sh: the test Redis server on port $port did not answer; its log:" >&2
    cat "$dir/redis.log" >&2 || true
    return 1
}

worklease_redis_service
unset -f worklease_redis_service
