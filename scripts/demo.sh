#!/usr/bin/env bash
# kreg's main job on a fresh Debian 12 machine: install what is missing,
# build, list the plugins, and run a checked top-k.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target kreg kreg_topk
kreg=build/release/bin/kreg
$kreg list
$kreg run topk/sort --dims batch=8,n=1000,k=10 --check
$kreg run topk/sort --dims batch=8,n=1000,k=10,ragged=1 --dtype bf16 --dist bits --check
