# Sourced by `make test`: exports GRIDBOT_TEST_PG, the URL of a PostgreSQL server the tests may use.
# Uses the one at 127.0.0.1:5432 when it answers; otherwise installs Debian's package if needed and
# starts a throwaway cluster under /tmp that lives until the machine is reset.
set -e
if [ -z "${GRIDBOT_TEST_PG:-}" ]; then
  if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
    export GRIDBOT_TEST_PG="postgresql://postgres@127.0.0.1:5432/postgres"
  else
    PGPORT_TMP=55432
    PGDIR=/tmp/gridbot-pg
    PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$PGBIN" ]; then
      echo "make test: no PostgreSQL here; installing Debian's package" >&2
      if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
      $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
      PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    fi
    RUNAS=""
    if [ "$(id -u)" = 0 ]; then RUNAS="runuser -u postgres --"; fi
    if ! pg_isready -q -h 127.0.0.1 -p $PGPORT_TMP 2>/dev/null; then
      rm -rf $PGDIR && mkdir -p $PGDIR && [ -z "$RUNAS" ] || chown postgres $PGDIR
      $RUNAS "$PGBIN/initdb" -D $PGDIR/data -U postgres -A trust >/dev/null
      $RUNAS "$PGBIN/pg_ctl" -D $PGDIR/data -l $PGDIR/log -o "-p $PGPORT_TMP -k $PGDIR -c listen_addresses=127.0.0.1" -w start >/dev/null
    fi
    export GRIDBOT_TEST_PG="postgresql://postgres@127.0.0.1:$PGPORT_TMP/postgres"
  fi
fi
echo "make test: PostgreSQL for the tests at $GRIDBOT_TEST_PG" >&2
set +e
