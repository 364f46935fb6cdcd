#!/usr/bin/env bash
# The worklease library's public API as a list of its public items (ADR
# 0020): one line per item, "KIND PATH", read from the `all.html` page of
# the crate's docs built with every feature. CI compares it with the list
# checked in as docs/public-api.txt, so that every item added or removed
# shows in review; methods, fields and signatures are not in it
# (`cargo semver-checks` against the last release will see those).
#
#   packaging/public-api.sh          check: exit 1 with the difference
#   packaging/public-api.sh --bless  write docs/public-api.txt
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    "" | --bless) ;;
    *) echo "usage: $0 [--bless]" >&2; exit 64 ;;
esac

# The same build as .ci/run's doc check (so a no-op right after it).
RUSTDOCFLAGS="-D warnings" cargo doc -q -p worklease --all-features --no-deps
target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
page="$target_dir/doc/worklease/all.html"

# Each item is a link "a/b/struct.Name.html": "struct worklease::a::b::Name".
current=$(grep -o 'href="[a-z0-9_/]*[a-z]*\.[A-Za-z0-9_]*\.html"' "$page" |
    sed -e 's/^href="//' -e 's/\.html"$//' |
    sed -E 's#^(([a-z0-9_]+/)*)([a-z]+)\.([A-Za-z0-9_]+)$#\3 worklease/\1\4#' |
    sed -e 's#/#::#g' | LC_ALL=C sort -u)
[ -n "$current" ] || { echo "no items found in $page" >&2; exit 70; }

if [ "${1:-}" = --bless ]; then
    printf '%s\n' "$current" >docs/public-api.txt
    echo "docs/public-api.txt: $(printf '%s\n' "$current" | wc -l) public items"
elif ! diff -u docs/public-api.txt <(printf '%s\n' "$current"); then
    echo "the public API changed (above: - removed, + added): if that is meant, run" \
        "packaging/public-api.sh --bless and say so in CHANGELOG.md (a removal breaks" \
        "users: UPGRADING.md)" >&2
    exit 1
fi
