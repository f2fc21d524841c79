#!/bin/sh
# Make (once) the virtualenv the peer systems run in: `bench/peers/setup.sh [VENV]`.
# Re-running is cheap: the stamp records the requirements it was built from.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$here/../../.venv-peers}
stamp=$venv/.requirements
if [ -f "$stamp" ] && cmp -s "$stamp" "$here/requirements.txt"; then exit 0; fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
cp "$here/requirements.txt" "$stamp"
