#!/usr/bin/env bash
# lerobot 0.3.3 (writes LeRobot v2.1: one parquet and one video per episode) in its own venv (.venvs/lerobot_v21):
# tests/fixtures/make_lerobot_fixtures.py uses it for the v2.1 fixture.
#
# Installed like scripts/venvs/lerobot.sh: --no-deps (lerobot 0.3.3 caps torch below 2.8; this project keeps the
# CPU torch==2.13.0), then only what lerobot.datasets imports, with torchvision 0.22.1 (lerobot 0.3.3 pins <0.23) made
# importable by scripts/venvs/_torchvision_without_ops.py (installed --no-deps: it pins torch 2.7), and no
# torchcodec (video decodes through PyAV).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
venv_begin lerobot_v21
venv_pip install -q "torch==2.13.0" "torchvision==0.22.1" --no-deps
venv_pip install -q --no-deps "lerobot==0.3.3"
venv_pip install -q "torch==2.13.0" \
    "datasets>=2.19.0,<=3.6.0" "huggingface-hub>=0.34.2,<0.36.0" "av>=14.2.0,<16.0.0" "jsonlines>=4.0.0" \
    "packaging>=24.2" "draccus==0.10.0" "termcolor>=2.4.0,<4.0.0" "deepdiff>=7.0.1,<9.0.0" \
    "accelerate>=1.10.0,<2.0.0" "einops>=0.8.0" "imageio>=2.34.0,<3.0.0" "safetensors" "pillow" "numpy<2.5" "pyarrow" "pandas" "fsspec"
SITE="$("$VENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$REPO_ROOT/scripts/venvs/_torchvision_without_ops.py" "$SITE/"
echo "import _torchvision_without_ops" > "$SITE/_torchvision_without_ops.pth"
venv_end
