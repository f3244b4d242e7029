#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on the H200 device image, which lacks them (its torch,
# transformers, accelerate, peft, safetensors, xxhash and pyarrow are there, at its own versions):
# trl, datasets, dill and multiprocess at the versions installed here, for the device's Python 3.12
# on x86-64, downloaded into .whl/ (kept out of git by .git/info/exclude; about 2 MB).
#   bash bench/gpu_wheels.sh            (here, from the repository root; needs only the registry)
# Then one device call (the tool's `run`), carrying them:
#   carry [".whl"], timeout_s 560, command:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \
#     bash bench/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log
set -euo pipefail
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
version() { python3 -m pip show "$1" | sed -n 's/^Version: //p'; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "trl==$(version trl)" "datasets==$(version datasets)" "dill==$(version dill)" \
  "multiprocess==$(version multiprocess)"
ls .whl
