#!/usr/bin/env bash
# The stock BOINC client for the volunteer tests, from Debian's packages
# (see shared/reference/boinc-client-protocol.md; checked with 7.20.5).
#   scripts/boinc.sh install    install boinc-client if missing (root, apt); the service is left stopped:
#                               the tests start their own clients with their own data directories.
set -euo pipefail
cmd=${1:?usage: boinc.sh install}

install() {
  if command -v boinc >/dev/null && command -v boinccmd >/dev/null; then return; fi
  if [ "$(id -u)" != 0 ]; then echo "boinc.sh: installing boinc-client needs root" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends boinc-client >/dev/null
  # the package starts a system client on its own data directory; the tests do not use it
  if command -v systemctl >/dev/null && systemctl is-active --quiet boinc-client 2>/dev/null; then
    systemctl stop boinc-client || true
  fi
}

case "$cmd" in
  install) install ;;
  *) echo "boinc.sh: unknown command $cmd (use install)" >&2; exit 2 ;;
esac
