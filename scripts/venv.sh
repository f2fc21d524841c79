#!/bin/sh
# Make (once) gridbot's own virtualenv, the one `make test`, `make demo` and `make bench` run in:
# `scripts/venv.sh [VENV]` (the Makefile calls it before every target that needs it).
#
# Everything installed is pinned with hashes (requirements/dev.txt, compiled from pyproject.toml with its
# `dev` extra): first pip itself, then every dependency in pip's hash-checking mode, then gridbot, editable,
# with no dependency resolution and no build isolation (its build backend, setuptools, is in the lock too).
# So a package whose file changed on the index fails the install instead of being measured, and the
# benchmarks' gridbot side runs on the same packages as the peers' pinned side. Re-running is cheap: the
# stamp records the interpreter (its path and full version), the lock, pyproject.toml and this script; when
# any of them changed, the virtualenv is made anew.
#
# `scripts/venv.sh --lock` remakes requirements/dev.txt from pyproject.toml (pip-tools' pip-compile in a
# throwaway virtualenv), keeping the versions requirements/dev.txt has where they still satisfy
# pyproject.toml: after changing a dependency, run it and commit both files.
# PYTHON chooses the interpreter (default python3).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/requirements/dev.txt
python=${PYTHON:-python3}
. "$root/scripts/pinned-venv.sh"

if [ "${1:-}" = "--lock" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$root/pyproject.toml" "$root/requirements/tools.in" "$tmp/"
  [ -f "$lock" ] && cp "$lock" "$tmp/dev.txt"
  pinned_venv_compile "$python" "$tmp" dev.txt --extra dev pyproject.toml tools.in
  cp "$tmp/dev.txt" "$lock"
  echo "wrote $lock"
  exit 0
fi

venv=${1:-$root/.venv}
stamp=$venv/.installed-stamp
pinned_venv_begin "$python" "$venv" "$stamp" "$lock" "$lock" "$root/pyproject.toml" "$root/scripts/pinned-venv.sh"
[ -n "$fresh" ] || exit 0
"$venv/bin/python" -m pip install --quiet --require-hashes -r "$lock"
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$root"
pinned_venv_end "$venv" "$stamp"
