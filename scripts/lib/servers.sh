# Sourced by scripts/test: PostgreSQL and MariaDB for the suite. Uses the servers already running on
# loopback; where there are none, installs the Debian packages and starts throwaway servers with their
# data in a temporary directory, stopped again when the tests end. DIBS_TEST_THROWAWAY=1 starts
# throwaway servers even when the usual ones are up.

DIBS_THROWAWAY_DIR=""

dibs_port_open() {
    .venv/bin/python - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)
PY
}

dibs_wait_port() {
    for _ in $(seq 1 120); do
        dibs_port_open 127.0.0.1 "$1" && return 0
        sleep 0.5
    done
    echo "error: $2 did not start listening on 127.0.0.1:$1; its log is in $DIBS_THROWAWAY_DIR" >&2
    return 1
}

dibs_throwaway_dir() {
    if [ -z "$DIBS_THROWAWAY_DIR" ]; then
        DIBS_THROWAWAY_DIR=$(mktemp -d /tmp/dibs-servers.XXXXXX)
        chmod 755 "$DIBS_THROWAWAY_DIR"
        trap dibs_stop_servers EXIT
    fi
}

dibs_stop_servers() {
    [ -n "$DIBS_THROWAWAY_DIR" ] || return 0
    if [ -f "$DIBS_THROWAWAY_DIR/pg/postmaster.pid" ]; then
        dibs_as_service_user "$(dibs_pg_bin)/pg_ctl" -D "$DIBS_THROWAWAY_DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    fi
    if [ -f "$DIBS_THROWAWAY_DIR/mariadb/mariadb.pid" ]; then
        kill "$(cat "$DIBS_THROWAWAY_DIR/mariadb/mariadb.pid")" 2>/dev/null || true
    fi
    rm -rf "$DIBS_THROWAWAY_DIR"
}

dibs_as_service_user() {
    # PostgreSQL refuses to run as root.
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

dibs_pg_bin() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

# dibs_server_found NAME URL_VARIABLE PORT: succeeds (and says which) when the server named by the URL
# variable, or one on the usual loopback port, is to be used; fails when a throwaway one must start.
dibs_server_found() {
    local name="$1" variable="$2" port="$3"
    if [ -n "${!variable:-}" ]; then
        echo "== $name: ${!variable} (from $variable)"
        return 0
    fi
    if [ -z "${DIBS_TEST_THROWAWAY:-}" ] && dibs_port_open 127.0.0.1 "$port"; then
        echo "== $name: using the server on 127.0.0.1:$port"
        return 0
    fi
    echo "== $name: none on 127.0.0.1:$port; starting a throwaway server"
    return 1
}

dibs_postgres() {
    dibs_server_found PostgreSQL DIBS_TEST_POSTGRES_URL 5432 && return
    [ -n "$(dibs_pg_bin)" ] || dibs_apt_install postgresql
    dibs_throwaway_dir
    local port=54329 bin
    bin=$(dibs_pg_bin)
    mkdir -p "$DIBS_THROWAWAY_DIR/pg"
    [ "$(id -u)" = 0 ] && chown postgres "$DIBS_THROWAWAY_DIR/pg"
    dibs_as_service_user "$bin/initdb" -D "$DIBS_THROWAWAY_DIR/pg" -U postgres --auth=trust >/dev/null
    dibs_as_service_user "$bin/pg_ctl" -D "$DIBS_THROWAWAY_DIR/pg" -l "$DIBS_THROWAWAY_DIR/pg/log" -w \
        -o "-p $port -k $DIBS_THROWAWAY_DIR/pg -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
        start >/dev/null
    dibs_wait_port "$port" PostgreSQL
    export DIBS_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    echo "   started PostgreSQL on 127.0.0.1:$port, data in $DIBS_THROWAWAY_DIR/pg"
}

dibs_mariadb() {
    dibs_server_found MariaDB DIBS_TEST_MARIADB_URL 3306 && return
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || dibs_apt_install mariadb-server
    dibs_throwaway_dir
    local port=33069 user=root data="$DIBS_THROWAWAY_DIR/mariadb"
    id mysql >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && user=mysql
    mkdir -p "$data"
    [ "$user" = mysql ] && chown mysql "$data"
    mariadb-install-db --no-defaults --datadir="$data" --user="$user" --skip-test-db >/dev/null 2>&1
    # A throwaway server for tests: no grant tables, so root needs no password.
    /usr/sbin/mariadbd --no-defaults --datadir="$data" --user="$user" --port="$port" --bind-address=127.0.0.1 \
        --socket="$data/mariadb.sock" --pid-file="$data/mariadb.pid" \
        --skip-grant-tables --innodb-flush-log-at-trx-commit=2 --max-connections=300 \
        --log-error="$data/error.log" &
    dibs_wait_port "$port" MariaDB
    export DIBS_TEST_MARIADB_URL="mysql+pymysql://root@127.0.0.1:$port/mysql"
    echo "   started MariaDB on 127.0.0.1:$port, data in $data"
}
