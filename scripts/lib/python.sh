# Sourced by the scripts: a virtual environment in .venv with dibs and its extras installed.
# Reinstalls only when pyproject.toml changed since the last install.

dibs_python() {
    local extras="$1"
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
        dibs_apt_install python3 python3-venv python3-pip
    fi
    if [ ! -x .venv/bin/python ]; then
        if ! python3 -m venv .venv 2>/dev/null; then
            rm -rf .venv
            dibs_apt_install python3-venv
            python3 -m venv .venv
        fi
    fi
    local stamp=".venv/.dibs-installed-$extras"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "== installing dibs-sql[$extras] into .venv"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
        # The distribution was named dibs before dibs-sql; an install under the old name would shadow this one.
        if .venv/bin/python -m pip show --quiet dibs >/dev/null 2>&1; then
            .venv/bin/python -m pip uninstall --quiet --disable-pip-version-check --yes dibs
        fi
        # dev builds mysqlclient (Django's MySQL driver, for the Django tests on MariaDB) from source.
        if [[ ",$extras," == *,dev,* ]] && ! pkg-config --exists mysqlclient 2>/dev/null; then
            dibs_apt_install default-libmysqlclient-dev pkg-config gcc python3-dev
        fi
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
        touch "$stamp"
    fi
}

dibs_apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "error: this needs the Debian packages $*; install them (or run as root on Debian/Ubuntu)" >&2
        exit 1
    fi
    echo "== installing Debian packages: $*"
    if [ -z "${DIBS_APT_UPDATED:-}" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DIBS_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Debian's Chromium, which the dashboard's browser tests drive through Playwright (no browser is downloaded).
dibs_chromium() {
    if [ ! -x /usr/bin/chromium ]; then
        dibs_apt_install chromium
    fi
}
