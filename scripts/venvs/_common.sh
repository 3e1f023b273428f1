# Shared steps of the third-party venv scripts in scripts/venvs/ (sourced, not run).
# Each script builds .venvs/<name>/ with the repository's python3 and stamps it with the hash of the
# script itself, so CI rebuilds a venv only when its recipe changes.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENVS_DIR="$REPO_ROOT/.venvs"

venv_begin() {
    VENV_NAME="$1"
    VENV_DIR="$VENVS_DIR/$VENV_NAME"
    VENV_PY_HOST="${VENV_PYTHON:-python3}"
    local script="$REPO_ROOT/scripts/venvs/$VENV_NAME.sh"
    VENV_STAMP="$VENV_DIR/.built-$(cat "$script" "$REPO_ROOT/scripts/venvs/_common.sh" | sha1sum | cut -c1-16)"
    if [[ -f "$VENV_STAMP" ]]; then
        echo "venvs: $VENV_NAME up to date" >&2
        exit 0
    fi
    echo "venvs: building $VENV_NAME in .venvs/$VENV_NAME" >&2
    rm -rf "$VENV_DIR"
    "$VENV_PY_HOST" -m venv "$VENV_DIR"
    "$VENV_DIR/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
}

venv_pip() {
    "$VENV_DIR/bin/python" -m pip "$@"
}

venv_end() {
    touch "$VENV_STAMP"
    echo "venvs: $VENV_NAME ready" >&2
}
