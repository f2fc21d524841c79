# Sourced by scripts/venv.sh (gridbot's own virtualenv) and bench/peers/setup.sh (the peers'): the part both
# share of making a virtualenv whose every package is pinned with hashes.
#
# pinned_venv_begin PYTHON VENV STAMP LOCK FILE...: return at once (with `fresh` empty) if STAMP records this
# interpreter (its path and full version) and the FILEs (the pins, and this file) and the calling script as they
# are; else
# make VENV anew with pip installed from LOCK's hashed pin (`fresh` set), for the caller to install the rest.
# pinned_venv_end VENV STAMP: check the installed packages agree (pip's complaint on stderr) and write the stamp.
# pinned_venv_compile PYTHON DIR OUT ARG...: pip-tools' pip-compile, from a throwaway virtualenv made in DIR, run in
# DIR with ARGs (its inputs, copied there by the caller), writing every pin with its hashes to DIR/OUT.

pinned_venv_compile() {
  _python=$1 _dir=$2 _out=$3
  shift 3
  "$_python" -m venv "$_dir/venv"
  "$_dir/venv/bin/python" -m pip install --quiet pip-tools==7.6.2
  (cd "$_dir" && venv/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
    --no-emit-index-url --no-emit-find-links --output-file "$_out" "$@")
}

pinned_venv_begin() {
  _python=$1 _venv=$2 _stamp=$3 _lock=$4
  shift 4
  _interpreter=$("$_python" -c 'import platform, sys, os; print(os.path.realpath(sys.executable), platform.python_implementation(), sys.version.replace(chr(10), " "))')
  _want=$(printf '%s\n' "interpreter: $_interpreter"; cat "$@" "$0" | sha256sum)
  fresh=
  if [ -f "$_stamp" ] && [ "$(cat "$_stamp")" = "$_want" ]; then return 0; fi
  fresh=1
  echo "$0: making $_venv with $_interpreter" >&2
  "$_python" -m venv --clear "$_venv"
  _pins=$(mktemp)
  trap 'rm -f "$_pins"' EXIT
  # pip's own pin, with its hashes, as a requirements file: the pip a fresh virtualenv has may not read
  # hashes from a constraints file
  sed -n '/^pip==/,/^ *#/p' "$_lock" | grep -v '^ *#' > "$_pins"
  "$_venv/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$_pins"
  rm -f "$_pins"
}

pinned_venv_end() {
  "$1/bin/python" -m pip check 1>&2
  printf '%s\n' "$_want" > "$2"
}
