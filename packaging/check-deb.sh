#!/usr/bin/env bash
# Installs the Debian package DEB (packaging/build-deb.sh prints its path)
# with dpkg and checks what it installed: the command's version, every man
# page (groff with all warnings), the completion scripts (bash loads its
# own), the configuration file (a conffile, read from /etc by every
# command), and the systemd units (systemd-analyze verify, where systemd is
# installed; each one's ExecStart line, run as systemd would). Purges the package at the end. Root only (CI runs as root);
# installs groff-base when it is missing. As another user, outside CI, it
# says so and checks nothing.
set -euo pipefail
deb=${1:?usage: $0 DEB}
if [ "$(id -u)" != 0 ]; then
    # CI runs as root; a developer's run of .ci/run as a user skips this.
    [ "${CI:-}" != true ] || { echo "check-deb: CI must run as root (dpkg -i)" >&2; exit 77; }
    echo "check-deb: not root: $deb was built, not installed nor checked" >&2
    exit 0
fi
fail() { echo "check-deb: $*" >&2; exit 1; }

missing=()
command -v groff >/dev/null 2>&1 || missing+=(groff-base)
command -v adduser >/dev/null 2>&1 || missing+=(adduser)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

dpkg -i "$deb" >/dev/null
trap 'dpkg --purge worklease >/dev/null 2>&1 || true' EXIT

# The command, at the package's version.
version=$(dpkg-deb --field "$deb" Version)
/usr/bin/worklease --version | grep -qx "worklease ${version%-*}" ||
    fail "worklease --version says '$(/usr/bin/worklease --version)', the package $version"

# Every man page renders without a warning; one per visible subcommand.
pages=(/usr/share/man/man1/worklease*.1.gz)
[ -e "${pages[0]}" ] || fail "no man page in /usr/share/man/man1"
for page in "${pages[@]}"; do
    warnings=$(zcat "$page" | groff -man -z -ww 2>&1) || fail "groff failed on $page: $warnings"
    [ -z "$warnings" ] || fail "groff warns on $page: $warnings"
done
for sub in $(/usr/bin/worklease --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p'); do
    [ "$sub" = help ] || [ -e "/usr/share/man/man1/worklease-$sub.1.gz" ] || fail "no man page for $sub"
done

# The completions, where each shell looks; bash's loads.
for f in /usr/share/bash-completion/completions/worklease \
    /usr/share/zsh/vendor-completions/_worklease \
    /usr/share/fish/vendor_completions.d/worklease.fish; do
    [ -s "$f" ] || fail "missing $f"
done
bash -c 'source /usr/share/bash-completion/completions/worklease && complete -p worklease' >/dev/null ||
    fail "bash cannot load the completion script"

# The system user and the default store's directory.
getent passwd worklease >/dev/null || fail "no system user worklease"
[ "$(stat -c %U /var/lib/worklease)" = worklease ] || fail "/var/lib/worklease is not worklease's"

# The units: systemd-analyze verify loads each as an instance (with an
# environment file, as an operator writes one) and checks its ExecStart.
units=(/usr/lib/systemd/system/worklease-elect@.service /usr/lib/systemd/system/worklease-pool@.service
    /usr/lib/systemd/system/worklease-run@.service /usr/lib/systemd/system/worklease-run@.timer)
for unit in "${units[@]}"; do [ -s "$unit" ] || fail "missing $unit"; done
if command -v systemd-analyze >/dev/null 2>&1; then
    install -d /etc/worklease
    cp /usr/share/doc/worklease/examples/elect.env /etc/worklease/elect-ci-check.env
    cp /usr/share/doc/worklease/examples/pool.env /etc/worklease/pool-ci-check.env
    cp /usr/share/doc/worklease/examples/run.env /etc/worklease/run-ci-check.env
    trap 'rm -f /etc/worklease/*-ci-check.env; dpkg --purge worklease >/dev/null 2>&1 || true' EXIT
    out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no \
        worklease-elect@ci-check.service worklease-pool@ci-check.service \
        worklease-run@ci-check.service worklease-run@ci-check.timer 2>&1) ||
        fail "systemd-analyze verify: $out"
    # Warnings about the unit files themselves fail; ones about units
    # outside the package (this machine's own) do not.
    if echo "$out" | grep -q "worklease-"; then fail "systemd-analyze verify: $out"; fi
else
    echo "check-deb: systemd-analyze is not installed: the units' syntax was not verified" >&2
fi
# Each unit's ExecStart line runs as its user, expanded as systemd does it
# (%i the instance, $VAR split at whitespace; sh does the same here), with
# a COMMAND that leaves a file and a store of its own: elect leads and
# runs it, the pool runs it for its one work ID; both exit 0.
store_dir=$(mktemp -d)
chown worklease:worklease "$store_dir"
trap 'rm -rf "$store_dir" /etc/worklease/*-ci-check.env; dpkg --purge worklease >/dev/null 2>&1 || true' EXIT
exec_start() { # UNIT OPTS_VAR OPTS [VAR=VALUE...]: runs its ExecStart line
    local line command="touch $store_dir/$1.ran"
    line=$(sed -n 's/^ExecStart=//p' "/usr/lib/systemd/system/$1")
    line=${line//%i/ci-check}
    line=${line//%%/%}
    line=${line//\$\$/\$}
    runuser -u worklease -- env -i PATH=/usr/bin:/bin WORKLEASE_HOME="$store_dir" \
        "$2=$3" COMMAND="$command" "${@:4}" sh -c "exec $line" ||
        fail "$1's ExecStart ($line, $2=$3, COMMAND=$command) exited $?"
}
run_unit() { # as exec_start; COMMAND must run
    exec_start "$@"
    [ -e "$store_dir/$1.ran" ] || fail "$1's ExecStart did not run COMMAND"
}
run_unit worklease-elect@.service ELECT_OPTS "--ttl 2s"
run_unit worklease-pool@.service POOL_OPTS "--ttl 1s --work-ids ci-a"
[ -s "$store_dir/leases.db" ] || fail "the units' default store is not \$WORKLEASE_HOME/leases.db"
# The run unit: once per period; a second start in the period finds the
# job finished and runs nothing (exit 0).
run_unit worklease-run@.service RUN_OPTS "--ttl 2s" PERIOD=%Y-%m-%d
rm "$store_dir/worklease-run@.service.ran"
exec_start worklease-run@.service RUN_OPTS "--ttl 2s" PERIOD=%Y-%m-%d 2>/dev/null
[ ! -e "$store_dir/worklease-run@.service.ran" ] || fail "worklease-run@ ran a finished job again"

# The configuration file: a conffile, commented out, read from /etc by a
# command in cron's empty environment.
dpkg-query -W -f='${Conffiles}' worklease | grep -q ' /etc/worklease/config.toml ' ||
    fail "/etc/worklease/config.toml is not a conffile"
grep -q '^#store = ' /etc/worklease/config.toml || fail "/etc/worklease/config.toml is not the commented example"
cp /etc/worklease/config.toml "$store_dir/config.toml.orig"
echo "store = \"sqlite:$store_dir/from-etc.db\"" >>/etc/worklease/config.toml
runuser -u worklease -- env -i PATH=/usr/bin:/bin HOME=/nonexistent /usr/bin/worklease run ci-etc -- true ||
    fail "a run with the store named in /etc/worklease/config.toml failed"
cp "$store_dir/config.toml.orig" /etc/worklease/config.toml
[ -s "$store_dir/from-etc.db" ] || fail "/etc/worklease/config.toml's store was not used"

echo "check-deb: $(basename "$deb"): installs, and its command, man pages, completions, units and their ExecStart lines check"
