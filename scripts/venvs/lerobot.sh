#!/usr/bin/env bash
# lerobot 0.4.4 (writes LeRobot v3.0) in its own venv (.venvs/lerobot): the fixture script
# tests/fixtures/make_lerobot_fixtures.py and the export tests of tests/test_lerobot.py drive it in subprocesses.
#
# Why --no-deps: every lerobot from 0.3 on caps torch below 2.13, and this project keeps the CPU torch==2.13.0
# from the local wheel store. 0.4.4 is the newest lerobot that runs on Python 3.11. Only what lerobot.datasets
# imports is installed (no policies, robots, wandb, rerun): lerobot's own pins where they fit,
# torchvision 0.23.0 (the last with torchvision.io.VideoReader, which lerobot decodes video with when torchcodec is
# absent; its PyPI wheel is a CUDA build whose ops do not load next to a CPU torch, so the start-up hook
# scripts/venvs/_torchvision_without_ops.py lets it import; --no-deps, as it pins torch 2.8), and
# no torchcodec, so lerobot decodes video with PyAV (av<16 as lerobot 0.4.4 pins; its wheels carry libsvtav1).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
venv_begin lerobot
venv_pip install -q "torch==2.13.0" "torchvision==0.23.0" --no-deps
venv_pip install -q --no-deps "lerobot==0.4.4"
venv_pip install -q "torch==2.13.0" \
    "datasets>=4.0.0,<5.0.0" "huggingface-hub>=0.34.2,<0.36.0" "av>=15.0.0,<16.0.0" "jsonlines>=4.0.0,<5.0.0" \
    "packaging>=24.2,<26.0" "draccus==0.10.0" "termcolor>=2.4.0,<4.0.0" "deepdiff>=7.0.1,<9.0.0" \
    "accelerate>=1.10.0,<2.0.0" "einops>=0.8.0,<0.9.0" "imageio>=2.34.0,<3.0.0" "safetensors" "pillow" "numpy<2.5" "pyarrow" "pandas" "fsspec"
SITE="$("$VENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$REPO_ROOT/scripts/venvs/_torchvision_without_ops.py" "$SITE/"
echo "import _torchvision_without_ops" > "$SITE/_torchvision_without_ops.pth"
venv_end
