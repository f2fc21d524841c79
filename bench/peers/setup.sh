#!/bin/sh
# Make (once) the virtualenv the peer systems run in: `bench/peers/setup.sh [VENV]`.
#
# Everything installed is pinned with hashes (constraints.txt): first pip itself, then the peers, in
# pip's hash-checking mode, so a package whose file changed on the index fails the install instead of
# being measured. Re-running is cheap: the stamp records the interpreter (its path and full version),
# the pins and this script; when any of them changed, the virtualenv is made anew.
#
# `bench/peers/setup.sh --lock` remakes constraints.txt from requirements.txt (pip-tools' pip-compile in
# a throwaway virtualenv), keeping the versions constraints.txt has where they still satisfy
# requirements.txt: after changing a pin, run it and commit both files.
# PYTHON chooses the interpreter (default python3).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
lib=$here/../../scripts/pinned-venv.sh
. "$lib"

if [ "${1:-}" = "--lock" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/requirements.txt" "$tmp/requirements.txt"
  [ -f "$here/constraints.txt" ] && cp "$here/constraints.txt" "$tmp/constraints.txt"
  pinned_venv_compile "$python" "$tmp" constraints.txt requirements.txt
  cp "$tmp/constraints.txt" "$here/constraints.txt"
  echo "wrote $here/constraints.txt"
  exit 0
fi

venv=${1:-$here/../../.venv-peers}
stamp=$venv/.installed
pinned_venv_begin "$python" "$venv" "$stamp" "$here/constraints.txt" "$here/requirements.txt" "$here/constraints.txt" "$lib"
[ -n "$fresh" ] || exit 0
"$venv/bin/python" -m pip install --quiet --require-hashes -r "$here/requirements.txt" -c "$here/constraints.txt"
pinned_venv_end "$venv" "$stamp"
