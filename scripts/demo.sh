#!/usr/bin/env bash
# kreg's main job on a fresh Debian 12 machine: install what is missing,
# build, load the plugins, tune top-k on a few shapes into a table (a minute
# or two), then answer queries from it and run what it picks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target kreg kreg_topk
kreg=build/release/bin/kreg
db=build/demo.lut
rm -f "$db"

echo "== the plugins and their kernels"
$kreg list
echo "== one kernel, checked against the reference"
$kreg run topk/sort --dims batch=8,n=1000,k=10 --check
echo "== a short sweep: every variant's parameter space, successive halving"
$kreg tune topk --db "$db" --strategy halving --budget 25 \
  --dims batch=32,n=32000,k=50 --dims batch=64,n=32768,k=1024 \
  --dims batch=1,n=500000,k=100 --dims batch=16,n=4096,k=8
echo "== queries: a tuned shape, untuned ones (nearest), another dtype (default)"
$kreg query topk --db "$db" --dims batch=32,n=32000,k=50 --dims batch=48,n=40000,k=64 \
  --dims batch=64,n=30000,k=2000
$kreg query topk --db "$db" --dtype bf16 --dims batch=32,n=32000,k=50
echo "== the table shipped for this machine"
$kreg query topk --db tuning_db/tables/amd-epyc-avx2-2c.txtpb --dims batch=100,n=150000,k=64
echo "== a run dispatched by the table, checked"
$kreg run topk --db "$db" --dims batch=48,n=40000,k=64 --check
