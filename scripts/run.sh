#!/usr/bin/env bash
# Project entry point: creates/refreshes the repo-local virtualenv, then runs
# one of the project tasks inside it.
#
#   bash scripts/run.sh demo  [args...]         unienv-data demo (python -m unienv_data demo)
#   bash scripts/run.sh cli   <command> [args]  unienv-data <command> (info, verify, plot, convert, ...)
#   bash scripts/run.sh test  [pytest args...]  pytest -q -n 2 (xdist), then the Ray tests in their own process
#   bash scripts/run.sh mypy                    mypy, the private-access scan, then lint-imports (layer contracts)
#   bash scripts/run.sh docs  [args...]         mkdocs build --strict (site in build/site)
#   bash scripts/run.sh bench [args...]         bench/bench_flattened.py
#
# Works from any directory. Needs only python3 (with pip) on the host.
# pip may warn that some local index locations are ignored; that is harmless.
set -euo pipefail

usage() {
    sed -n '5,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
}

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

if [[ $# -lt 1 ]]; then
    echo "usage: bash scripts/run.sh {demo|cli|test|mypy|docs|bench} [args...]" >&2
    usage
    exit 2
fi
cmd="$1"
shift

case "$cmd" in
    demo|cli|test|mypy|docs|bench) ;;
    -h|--help|help)
        echo "usage: bash scripts/run.sh {demo|cli|test|mypy|docs|bench} [args...]"
        usage 2>&1
        exit 0
        ;;
    *)
        echo "run.sh: unknown command '$cmd'" >&2
        echo "usage: bash scripts/run.sh {demo|cli|test|mypy|docs|bench} [args...]" >&2
        exit 2
        ;;
esac

HOST_PY="${PYTHON:-python3}"
VENV="$REPO_ROOT/.venv"
PY="$VENV/bin/python"
CONSTRAINTS="constraints/ci.txt"

# --- 1. virtualenv ----------------------------------------------------------
if [[ ! -x "$PY" ]]; then
    echo "run.sh: creating virtualenv in .venv" >&2
    if ! "$HOST_PY" -m venv "$VENV"; then
        # Some distros ship python3 without ensurepip: fall back to a bare
        # venv and let the host's pip install pip into it.
        echo "run.sh: 'python3 -m venv' failed; retrying without ensurepip" >&2
        rm -rf "$VENV"
        "$HOST_PY" -m venv --without-pip "$VENV"
        "$HOST_PY" -m pip --python "$PY" install -q pip
    fi
fi

# --- 2. dependencies (only when pyproject/constraints changed) ---------------
stamp_hash="$("$PY" - <<'PYEOF'
import hashlib
h = hashlib.sha1()
for name in ("pyproject.toml", "constraints/ci.txt"):
    with open(name, "rb") as f:
        h.update(f.read())
print(h.hexdigest())
PYEOF
)"
STAMP="$VENV/.installed-$stamp_hash"

if [[ ! -f "$STAMP" ]]; then
    echo "run.sh: installing project into .venv (extras: torch,jax,video,hdf5,parquet,ray,gym,huggingface,minari,lerobot,dev)" >&2
    "$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[torch,jax,video,hdf5,parquet,ray,gym,huggingface,minari,lerobot,dev]"
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
fi

# --- 3. task -----------------------------------------------------------------
case "$cmd" in
    demo)  exec "$PY" -m unienv_data demo "$@" ;;
    cli)   exec "$PY" -m unienv_data "$@" ;;
    test)
        # Two pytest runs: the Ray tests in a process of their own. A Ray driver leaves gRPC threads behind, and a
        # process forked after them (a DataLoader worker of a later test in the same xdist worker) can deadlock.
        status=0
        "$PY" -m pytest -q -n 2 --dist loadgroup -m "not ray" "$@" || status=$?
        ray_status=0
        "$PY" -m pytest -q -m ray "$@" || ray_status=$?
        [[ $ray_status -eq 5 ]] && ray_status=0    # 5: the arguments selected no Ray test
        [[ $status -eq 5 ]] && status=0
        if [[ $status -ne 0 ]]; then exit "$status"; fi
        exit "$ray_status"
        ;;
    mypy)  "$PY" -m mypy "$@" && "$PY" scripts/check_private_access.py && exec "$VENV/bin/lint-imports" --config pyproject.toml ;;
    docs)  exec "$PY" -m mkdocs build --strict "$@" ;;
    bench) exec "$PY" bench/bench_flattened.py "$@" ;;
esac
