#!/bin/sh
# What the official image's entrypoint does, as far as compose.yaml needs it: a first start makes the
# cluster, the user and the database with the password from POSTGRES_PASSWORD_FILE; then postgres.
set -eu
bin="$(echo /usr/lib/postgresql/*/bin)"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  while [ ! -s "${POSTGRES_PASSWORD_FILE:?}" ]; do sleep 0.5; done
  pwfile="$(mktemp)"
  cat "$POSTGRES_PASSWORD_FILE" >"$pwfile"
  chown postgres "$pwfile"
  as_pg "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_pg "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  [ "$db" = postgres ] || as_pg "$bin/createdb" -U "$user" "$db"
  as_pg "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
fi
[ "$1" = postgres ] && shift
exec setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$PGDATA" "$@"
