#!/usr/bin/env bash
# Builds every third-party venv the tests drive in subprocesses (the reference unienv, lerobot, minari, ...):
# one script per venv in scripts/venvs/, each idempotent. CI runs this before the tests, so the tests that
# need those packages run there instead of skipping (tests/_third_party.py fails them under CI=true).
#
#   bash scripts/build_venvs.sh            # all of them
#   bash scripts/build_venvs.sh unienv     # just the named ones
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ $# -gt 0 ]]; then names=("$@"); else
    names=(); for f in scripts/venvs/*.sh; do b="$(basename "$f" .sh)"; [[ "$b" == _* ]] || names+=("$b"); done
fi
status=0
for name in "${names[@]}"; do
    if ! bash "scripts/venvs/$name.sh"; then echo "venvs: building $name FAILED" >&2; status=1; fi
done
exit "$status"
