# Azurite (Microsoft's Azure Storage emulator, the npm package `azurite`)
# for the object-storage store's tests on Azure Blob Storage; sourced by
# .ci/run (set -euo pipefail, a `cleanup` array of commands run at exit).
#
# Installs azurite under ${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}/azurite
# (npm, with Node.js and npm from apt when missing) and reuses it after.
# Always starts a blob service of its own on a free loopback port over a
# throwaway data directory (telemetry off), stopped and removed at exit;
# creates the test container (object_store cannot) with
# lib/azurite-container.py, and exports WORKLEASE_TEST_AZURE_URL with
# AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY: Azurite's
# well-known development account (devstoreaccount1 and its published key,
# which every Azure SDK documents), in the environment only, never in
# the URL.

worklease_azurite_service() {
    local cache="${WORKLEASE_CI_CACHE:-/var/cache/worklease-ci}"
    local npm_dir="$cache/azurite"
    local account="devstoreaccount1"
    local container="worklease-test"
    local dir port="" candidate tries

    if ! command -v curl >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "azurite: installing curl, nodejs and npm (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq curl nodejs npm >/dev/null
    fi
    if [ ! -f "$npm_dir/node_modules/azurite/package.json" ]; then
        echo "azurite: npm install azurite@3 into $npm_dir"
        mkdir -p "$npm_dir"
        (cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error azurite@3)
    fi

    for candidate in $(seq 10100 10200); do
        if ! (: </dev/tcp/127.0.0.1/"$candidate") 2>/dev/null; then
            port="$candidate"
            break
        fi
    done
    if [ -z "$port" ]; then
        echo "azurite.sh: no free loopback port in 10100-10200" >&2
        return 1
    fi
    dir="$(mktemp -d -t worklease-azurite.XXXXXX)"
    node "$npm_dir/node_modules/azurite/dist/src/blob/main.js" \
        --blobHost 127.0.0.1 --blobPort "$port" --location "$dir/data" \
        --disableTelemetry --disableProductStyleUrl --skipApiVersionCheck --silent \
        >"$dir/azurite.log" 2>&1 &
    echo $! >"$dir/azurite.pid"
    cleanup+=("kill \"\$(cat '$dir/azurite.pid')\" 2>/dev/null; rm -rf '$dir'")
    # Any HTTP answer (400 to a bare GET) means it listens.
    for tries in $(seq 1 300); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
            break
        fi
        if ! kill -0 "$(cat "$dir/azurite.pid")" 2>/dev/null || [ "$tries" = 300 ]; then
            echo "azurite.sh: azurite did not answer on 127.0.0.1:$port; its log:" >&2
            cat "$dir/azurite.log" >&2 || true
            return 1
        fi
        sleep 0.1
    done
    echo "azurite: started a throwaway blob service on 127.0.0.1:$port"

    export AZURE_STORAGE_ACCOUNT_NAME="$account"
    export AZURE_STORAGE_ACCOUNT_KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    python3 "$(dirname "${BASH_SOURCE[0]}")/lib/azurite-container.py" \
        "http://127.0.0.1:$port/$account" "$container"
    export WORKLEASE_TEST_AZURE_URL="azblob://$container/ci?endpoint=http://127.0.0.1:$port/$account"
}

worklease_azurite_service
unset -f worklease_azurite_service
