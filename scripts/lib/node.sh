# Sourced by scripts/bench: the Node peers (graphile-worker, pg-boss) from the npm registry, in
# benchmarks/node_peers, a folder of its own (gitignored). Without Node it says so and the run leaves them out.

DIBS_NODE_PEERS_PACKAGES="graphile-worker@0.17 pg-boss@10"

dibs_node_peers() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "== Node.js (node and npm) is missing: graphile-worker and pg-boss are left out of this run" >&2
        return 0
    fi
    local folder=benchmarks/node_peers
    local stamp="$folder/.installed"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$DIBS_NODE_PEERS_PACKAGES" ]; then
        return 0
    fi
    echo "== installing $DIBS_NODE_PEERS_PACKAGES into $folder (Node $(node --version))"
    mkdir -p "$folder"
    [ -f "$folder/package.json" ] || echo '{"name": "dibs-bench-node-peers", "private": true}' > "$folder/package.json"
    # shellcheck disable=SC2086
    (cd "$folder" && npm install --no-audit --no-fund --loglevel=error $DIBS_NODE_PEERS_PACKAGES)
    echo "$DIBS_NODE_PEERS_PACKAGES" > "$stamp"
}

# Node.js and npm from Debian's packages when the machine has none: the test suite runs the Node peers' drivers.
dibs_node() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        dibs_apt_install nodejs npm
    fi
}
