#!/usr/bin/env bash
# minari (with its HDF5 and Arrow data formats) and gymnasium in their own venv (.venvs/minari): the Minari
# tests read the committed fixtures and this project's `--to minari` exports back through `minari.load_dataset`
# in a subprocess, and tests/fixtures/make_minari_fixtures.py regenerates the fixtures with it. No torch needed.
# numpy, h5py and pyarrow carry the same pins as constraints/ci.txt. Idempotent (stamped by this script's hash).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
venv_begin minari
venv_pip install -q "minari[hdf5,arrow]==0.5.4" "gymnasium==1.4.0" "numpy==2.4.6" "h5py==3.16.0" \
    "pyarrow==26.0.1" "pillow==13.0.0"
venv_end
