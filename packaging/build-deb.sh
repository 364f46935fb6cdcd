#!/usr/bin/env bash
# Builds the Debian package of the `worklease` command with cargo-deb
# (crates/worklease-cli/Cargo.toml, [package.metadata.deb]): the binary,
# its man pages and shell completions (generated here by running the
# built binary), the systemd units and example configuration of
# crates/worklease-cli/debian/. Prints the path of the .deb.
#
#   packaging/build-deb.sh               release build, then the package
#   packaging/build-deb.sh --ci          the debug binary `cargo test` built
#                                        (no second, release build: CI only
#                                        checks the package's contents),
#                                        compressed fast
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
build=(cargo build --locked --release -p worklease-cli)
fast=()
case "${1:-}" in
    "") ;;
    --ci) profile=dev; build=(); fast=(--fast) ;;
    *) echo "usage: $0 [--ci]" >&2; exit 64 ;;
esac
profile_dir=$([ "$profile" = dev ] && echo debug || echo "$profile")

if ! cargo deb --version >/dev/null 2>&1; then
    echo "cargo-deb is missing: cargo install cargo-deb --locked" >&2
    exit 69
fi
if [ ${#build[@]} -gt 0 ]; then
    "${build[@]}"
fi

target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="$target_dir/$profile_dir/worklease"
if [ ! -x "$bin" ]; then
    echo "no binary at $bin: build it first (cargo build -p worklease-cli)" >&2
    exit 66
fi

# Generated assets, where the [package.metadata.deb] assets name them
# (cargo-deb reads target/release/ as the profile's directory).
out="$target_dir/$profile_dir/packaging"
# The man pages' date: the last commit's (reproducible), where there is one.
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
    export SOURCE_DATE_EPOCH
fi
rm -rf "$out"
mkdir -p "$out/completions"
"$bin" man --out-dir "$out/man"
# Compressed as Debian's policy asks (cargo-deb compresses only pages it
# does not count as build products).
gzip -9n "$out"/man/*.1
"$bin" completions bash >"$out/completions/worklease.bash"
"$bin" completions zsh >"$out/completions/_worklease"
"$bin" completions fish >"$out/completions/worklease.fish"

# cargo-deb prints the package's path; with --ci it also warns that a
# dev-profile package is for development only, which it is: its messages
# are shown only when it fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! deb=$(cargo deb --locked -p worklease-cli --no-build --profile "$profile" "${fast[@]}" 2>"$log"); then
    cat "$log" >&2
    exit 1
fi
echo "$deb" | tail -n 1
