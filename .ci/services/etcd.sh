# etcd for the tests of the etcd store (sourced by .ci/run, under
# `set -euo pipefail`, with a `cleanup` array of stop commands).
#
# Installs what is missing: the etcd server and etcdctl (Debian packages
# etcd-server and etcd-client; the cluster test starts members of its own
# from the same binary) and protoc (protobuf-compiler), which the
# etcd-client crate's build runs. Uses the member on 127.0.0.1:2379 when it
# answers; otherwise starts a throwaway single-member cluster on free
# loopback ports with a temporary data directory, and registers its stop.
# Exports WORKLEASE_TEST_ETCD_URL and WORKLEASE_TEST_ETCD_BIN. Quiet unless
# something fails.

worklease_etcd_service() {
    local missing=()
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
    command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
    if [ "${#missing[@]}" -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    export WORKLEASE_TEST_ETCD_BIN
    WORKLEASE_TEST_ETCD_BIN="$(command -v etcd)"

    if ETCDCTL_API=3 etcdctl --endpoints=http://127.0.0.1:2379 --dial-timeout=1s \
        endpoint health >/dev/null 2>&1; then
        export WORKLEASE_TEST_ETCD_URL="etcd://127.0.0.1:2379"
        return 0
    fi

    # Two free loopback ports (client, peer): nothing accepts connections.
    local ports=()
    local candidate
    for candidate in $(seq 23790 23990); do
        if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
            ports+=("$candidate")
            [ "${#ports[@]}" -eq 2 ] && break
        fi
    done
    if [ "${#ports[@]}" -lt 2 ]; then
        echo "etcd.sh: no two free ports in 23790-23990 for a test etcd" >&2
        return 1
    fi
    local client="http://127.0.0.1:${ports[0]}" peer="http://127.0.0.1:${ports[1]}"

    local dir
    dir="$(mktemp -d -t worklease-etcd.XXXXXX)"
    etcd --name ci --data-dir "$dir/data" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "ci=$peer" --initial-cluster-state new \
        >"$dir/etcd.log" 2>&1 &
    local pid=$!
    cleanup+=("kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -rf '$dir'")

    # Ready when it answers (about one second).
    local tries
    for tries in $(seq 1 100); do
        if ETCDCTL_API=3 etcdctl --endpoints="$client" --dial-timeout=1s \
            endpoint health >/dev/null 2>&1; then
            export WORKLEASE_TEST_ETCD_URL="etcd://127.0.0.1:${ports[0]}"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "etcd.sh: the test etcd on $client did not answer; its log:" >&2
    cat "$dir/etcd.log" >&2 || true
    return 1
}

worklease_etcd_service
unset -f worklease_etcd_service
