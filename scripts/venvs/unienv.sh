#!/usr/bin/env bash
# The reference, unienv 0.0.1b16, in its own venv (.venvs/unienv): the differential and file-compatibility
# tests drive it in subprocesses. Idempotent: does nothing when the stamp for this script's content exists.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
venv_begin unienv
venv_pip install -q "unienv==0.0.1b16" "torch==2.13.0" "h5py==3.16.0" "av==18.1.0" "pillow==13.0.0" "numpy==2.4.6"
venv_end
