# An S3-compatible server for the object-storage store's tests (moto's
# server, which honours conditional writes); sourced by .ci/run (set -euo
# pipefail, a `cleanup` array of commands run at exit).
#
# moto lives in a Python virtual environment under
# ${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}/moto-venv, made by
# lib/moto-venv.sh on first use and reused after. Uses a moto server
# already answering on 127.0.0.1:5000 (moto's default port); otherwise starts one on a free loopback port, stopped and
# removed at exit. Creates the test bucket (object_store cannot) with boto3
# from the same environment, and exports WORKLEASE_TEST_S3_URL and, unless
# already set, dummy AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (moto takes
# any SigV4 signature).

worklease_moto_service() {
    local cache="${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}"
    local venv="$cache/moto-venv"
    local bucket="worklease-test"
    local region="us-east-1"

    # shellcheck source=lib/moto-venv.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib/moto-venv.sh"
    worklease_moto_venv "$venv"

    local port=""
    if curl -sf -o /dev/null "http://127.0.0.1:5000/moto-api/"; then
        port=5000
        echo "moto: using the server on 127.0.0.1:5000"
    else
        local candidate
        for candidate in $(seq 15000 15100); do
            if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
                port="$candidate"
                break
            fi
        done
        if [ -z "$port" ]; then
            echo "moto.sh: no free loopback port in 15000-15100 for a moto server" >&2
            return 1
        fi
        local dir
        dir="$(mktemp -d -t worklease-moto.XXXXXX)"
        "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$dir/moto.log" 2>&1 &
        echo $! >"$dir/moto.pid"
        cleanup+=("kill \"\$(cat '$dir/moto.pid')\" 2>/dev/null; rm -rf '$dir'")
        local tries
        for tries in $(seq 1 300); do
            if curl -sf -o /dev/null "http://127.0.0.1:$port/moto-api/"; then
                break
            fi
            if ! kill -0 "$(cat "$dir/moto.pid")" 2>/dev/null || [ "$tries" = 300 ]; then
                echo "moto.sh: the moto server on port $port did not answer; its log:" >&2
                cat "$dir/moto.log" >&2 || true
                return 1
            fi
            sleep 0.1
        done
        echo "moto: started a throwaway server on 127.0.0.1:$port"
    fi

    export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-worklease-test}"
    export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-worklease-test}"
    # The bucket, once (an existing one is fine: its objects are under
    # per-test prefixes).
    "$venv/bin/python" - "http://127.0.0.1:$port" "$bucket" "$region" <<'PY'
import sys
import boto3
endpoint, bucket, region = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region)
try:
    s3.create_bucket(Bucket=bucket)
except s3.exceptions.BucketAlreadyOwnedByYou:
    pass
PY
    export WORKLEASE_TEST_S3_URL="s3://$bucket/ci?endpoint=http://127.0.0.1:$port&region=$region"
}

worklease_moto_service
unset -f worklease_moto_service worklease_moto_venv
