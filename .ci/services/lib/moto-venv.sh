# Makes sure moto's Python virtual environment exists; sourced by the
# service scripts that run moto (moto.sh for S3, dynamodb.sh for DynamoDB),
# which call `worklease_moto_venv VENV_DIR`. Installs curl, python3 and
# python3-venv from apt when missing; makes the environment (moto with its
# S3 and DynamoDB extras, flask, flask-cors, boto3) on first use and reuses
# it after.

worklease_moto_venv() {
    local venv="$1"
    if ! command -v curl >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1 \
        || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        echo "moto: installing curl, python3 and python3-venv (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq curl python3 python3-venv >/dev/null
    fi
    if [ ! -x "$venv/bin/moto_server" ] \
        || ! "$venv/bin/python" -c 'import boto3, moto, py_partiql_parser' >/dev/null 2>&1; then
        echo "moto: making the virtual environment $venv (pip install moto[s3,dynamodb] flask flask-cors boto3)"
        mkdir -p "$(dirname "$venv")"
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check 'moto[s3,dynamodb]' flask flask-cors boto3
    fi
}
