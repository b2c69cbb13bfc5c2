#!/usr/bin/env bash
# Unpack the C++ headers of the newest torch that pip can install here into .torch-headers/<version>/
# (about 40 MB; the wheel itself is removed), for tests/test_build_torch_headers.py: every C++
# source is compiled against them with the flags setup.py would choose. Usage: scripts/torch_headers.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
spec="torch${1:+==$1}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: "$spec" -d "$tmp"
wheel=$(ls "$tmp"/torch-*.whl)
version=$(basename "$wheel" | cut -d- -f2)
dest=.torch-headers/$version
if [ ! -e "$dest/torch/include/ATen/ATen.h" ]; then
  mkdir -p "$dest"
  python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/")])
PY
fi
echo "torch $version headers in $dest"
