#!/usr/bin/env bash
# A project-local PostgreSQL for "team mode" (MLflow backend store + Optuna storage), loopback only.
#
#   scripts/setup-postgres.sh            # install (Debian, as root) if missing, init, start, create user + DBs, print URLs
#   scripts/setup-postgres.sh status     # running? + the URLs
#   scripts/setup-postgres.sh stop       # stop the server (data is kept)
#
# Idempotent: a second run finds the cluster initialised and running and only re-checks the
# user, its password and the two databases; if another server already answers on the port with that
# user and those databases (e.g. started from another checkout), it is reused. Nothing here touches Debian's own clusters
# (/etc/postgresql, port 5432): the cluster lives in $EXGRPO_PG_DIR (default <repo>/.pg, git-ignored
# by a .gitignore the script writes inside it) and listens on 127.0.0.1:$EXGRPO_PG_PORT only.
#
# Settings (environment): EXGRPO_PG_PORT (55432), EXGRPO_PG_DIR (<repo>/.pg), EXGRPO_PG_USER (exgrpo),
# EXGRPO_PG_PASSWORD (exgrpo). As root the server runs as the `postgres` system user (postgres
# refuses to run as root); if that user cannot write EXGRPO_PG_DIR (e.g. a checkout under /root), the
# cluster goes to /var/lib/postgresql/exgrpo-<port> instead. As another user it runs as that user.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${EXGRPO_PG_PORT:-55432}"
PGDIR="${EXGRPO_PG_DIR:-$REPO/.pg}"
DBUSER="${EXGRPO_PG_USER:-exgrpo}"
DBPASS="${EXGRPO_PG_PASSWORD:-exgrpo}"
DATABASES=(mlflow optuna)
CMD="${1:-start}"

say() { printf 'setup-postgres: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

case "$CMD" in start|status|stop) ;; -h|--help|help) sed -n '2,17p' "$0"; exit 0 ;; *) die "unknown command '$CMD' (start|status|stop)" ;; esac
[[ "$PORT" =~ ^[0-9]+$ ]] || die "EXGRPO_PG_PORT=$PORT is not a port number"
[[ "$DBUSER" =~ ^[a-z_][a-z0-9_]*$ ]] || die "EXGRPO_PG_USER=$DBUSER: use lower-case letters, digits and _"
[[ "$DBPASS" != *"'"* ]] || die "EXGRPO_PG_PASSWORD must not contain a single quote"

# ---------------------------------------------------------------------------- server binaries
find_bindir() {
    local d
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then echo "$d"; return 0; fi
    if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v pg_ctl)"; return 0
    fi
    return 1
}

BINDIR="$(find_bindir || true)"
if [[ -z "$BINDIR" ]]; then
    [[ "$CMD" == start ]] || die "PostgreSQL server binaries not found (run: $0)"
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's postgresql (apt-get)..."
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends postgresql postgresql-client >/dev/null
        BINDIR="$(find_bindir)" || die "postgresql installed but initdb/pg_ctl not found under /usr/lib/postgresql"
    else
        die "PostgreSQL server binaries (initdb, pg_ctl) not found; as root on Debian: apt-get install postgresql"
    fi
fi

# ---------------------------------------------------------------------------- who runs it, where
if [[ $EUID -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' system user (install Debian's postgresql)"
    RUNAS=postgres
    as_pg() { runuser -u postgres -- "$@"; }
else
    RUNAS="$(id -un)"
    as_pg() { "$@"; }
fi

prepare_dir() {  # create $1 owned by RUNAS; fail if RUNAS cannot write it
    mkdir -p "$1" || return 1
    if [[ $EUID -eq 0 ]]; then chown postgres: "$1" || return 1; fi
    as_pg test -w "$1" -a -x "$1"
}

if [[ "$CMD" == start ]]; then
    if ! prepare_dir "$PGDIR" 2>/dev/null; then
        fallback="/var/lib/postgresql/exgrpo-$PORT"
        [[ $EUID -eq 0 ]] || die "cannot use $PGDIR (set EXGRPO_PG_DIR to a writable directory)"
        say "user postgres cannot write $PGDIR (a parent directory is not traversable); using $fallback"
        rmdir "$PGDIR" 2>/dev/null || true
        PGDIR="$fallback"
        prepare_dir "$PGDIR" || die "cannot prepare $PGDIR"
    fi
    chmod 0700 "$PGDIR"
    [[ -f "$PGDIR/.gitignore" ]] || { echo '*' > "$PGDIR/.gitignore"; [[ $EUID -ne 0 ]] || chown postgres: "$PGDIR/.gitignore"; }
elif [[ ! -d "$PGDIR/data" && -d "/var/lib/postgresql/exgrpo-$PORT/data" ]]; then
    PGDIR="/var/lib/postgresql/exgrpo-$PORT"
fi
DATA="$PGDIR/data"
SOCK="$PGDIR/run"
LOG="$PGDIR/postgres.log"

urls() {
    local db
    for db in "${DATABASES[@]}"; do
        echo "postgresql://$DBUSER:$DBPASS@127.0.0.1:$PORT/$db"
    done
    echo "# export MLFLOW_TRACKING_URI=postgresql://$DBUSER:$DBPASS@127.0.0.1:$PORT/mlflow"
    echo "# export EXGRPO_OPTUNA_STORAGE=postgresql://$DBUSER:$DBPASS@127.0.0.1:$PORT/optuna"
}

running() { [[ -f "$DATA/PG_VERSION" ]] && as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

port_in_use() {  # something (not necessarily ours) accepts TCP on 127.0.0.1:$PORT
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

case "$CMD" in
    status)
        if running; then say "running: $DATA on 127.0.0.1:$PORT"; urls; exit 0; fi
        say "not running ($DATA)"; exit 3 ;;
    stop)
        if running; then as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null; say "stopped ($DATA)"
        else say "not running ($DATA)"; fi
        exit 0 ;;
esac

PSQL="$BINDIR/psql"
[[ -x "$PSQL" ]] || PSQL="$(command -v psql)"
client_ok() {  # the check a client makes: TCP + password, every database
    local db
    for db in "${DATABASES[@]}"; do
        PGPASSWORD="$DBPASS" PGCONNECT_TIMEOUT=5 "$PSQL" -X -q -h 127.0.0.1 -p "$PORT" -U "$DBUSER" -d "$db" -tA \
            -c "SELECT 1" >/dev/null 2>&1 || return 1
    done
}

# another server on our port (e.g. the cluster of another checkout of this repo, such as CI's fresh
# clone on a developer's machine): use it if our user and databases answer, else stop here
if ! running && port_in_use; then
    if client_ok; then
        say "reusing the PostgreSQL already serving 127.0.0.1:$PORT (not $DATA): user $DBUSER and databases ${DATABASES[*]} answer"
        urls
        exit 0
    fi
    die "127.0.0.1:$PORT is already used by another process; set EXGRPO_PG_PORT to a free port"
fi

# ---------------------------------------------------------------------------- init (once)
if [[ ! -f "$DATA/PG_VERSION" ]]; then
    say "initdb $DATA ($("$BINDIR/postgres" --version))"
    prepare_dir "$DATA" || die "cannot prepare $DATA"
    chmod 0700 "$DATA"
    # local (unix socket in a 0700 directory: only the server's OS user and root reach it) = trust;
    # TCP = password (scram-sha-256)
    as_pg "$BINDIR/initdb" -D "$DATA" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 >"$PGDIR/initdb.log" 2>&1 \
        || { cat "$PGDIR/initdb.log" >&2; die "initdb failed"; }
fi
prepare_dir "$SOCK" || die "cannot prepare $SOCK"
chmod 0700 "$SOCK"

# our settings live in one file included from postgresql.conf (rewritten every run)
as_pg tee "$DATA/exgrpo.conf" >/dev/null <<EOF
# written by scripts/setup-postgres.sh (rewritten on every run)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCK'
unix_socket_permissions = 0700
max_connections = 200
shared_buffers = 64MB
synchronous_commit = off
password_encryption = 'scram-sha-256'
logging_collector = off
EOF
grep -q "^include_if_exists 'exgrpo.conf'" "$DATA/postgresql.conf" \
    || echo "include_if_exists 'exgrpo.conf'" | as_pg tee -a "$DATA/postgresql.conf" >/dev/null

# ---------------------------------------------------------------------------- start (unless running)
if running; then
    # running, but on our port? (EXGRPO_PG_PORT may have changed since it was started)
    if ! as_pg "$BINDIR/pg_isready" -q -h "$SOCK" -p "$PORT"; then
        say "running with other settings; restarting"
        as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    else
        say "already running: $DATA on 127.0.0.1:$PORT"
    fi
fi
if ! running; then
    if port_in_use; then
        die "127.0.0.1:$PORT is already used by another process; set EXGRPO_PG_PORT to a free port"
    fi
    say "starting on 127.0.0.1:$PORT (log: $LOG)"
    as_pg touch "$LOG"
    as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null \
        || { tail -n 30 "$LOG" >&2; die "pg_ctl start failed"; }
fi
for _ in $(seq 1 60); do
    as_pg "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
    sleep 0.5
done
as_pg "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT" || { tail -n 30 "$LOG" >&2; die "server does not accept connections"; }

# ---------------------------------------------------------------------------- user + databases
sql() { as_pg "$PSQL" -X -q -h "$SOCK" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -tA -c "$1"; }

if [[ "$(sql "SELECT 1 FROM pg_roles WHERE rolname = '$DBUSER'")" == 1 ]]; then
    sql "ALTER ROLE $DBUSER WITH LOGIN PASSWORD '$DBPASS'" >/dev/null
else
    sql "CREATE ROLE $DBUSER WITH LOGIN PASSWORD '$DBPASS'" >/dev/null
    say "created role $DBUSER"
fi
for db in "${DATABASES[@]}"; do
    if [[ "$(sql "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]]; then
        sql "CREATE DATABASE $db OWNER $DBUSER ENCODING 'UTF8' TEMPLATE template0" >/dev/null
        say "created database $db"
    fi
    sql "ALTER DATABASE $db OWNER TO $DBUSER" >/dev/null
done

client_ok || die "cannot connect to ${DATABASES[*]} as $DBUSER over TCP (127.0.0.1:$PORT)"
if [[ -x "$REPO/.venv/bin/python" ]] && ! "$REPO/.venv/bin/python" -c "import psycopg2" 2>/dev/null; then
    say "note: the venv has no PostgreSQL driver; pip install psycopg2-binary (requirements-cpu.txt)"
fi
say "ready: PostgreSQL on 127.0.0.1:$PORT, data in $DATA"
urls
