#!/usr/bin/env bash
# Re-tunes the shipped top-k table (topk.txtpb) on this machine: the seed
# shapes and a spread around them, f32, and the three seed shapes in bf16.
# About 5 minutes on 2 cores. Usage: tuning_db/tables/tune_topk.sh [TABLE]
set -euo pipefail
cd "$(dirname "$0")/../.."
db=${1:-tuning_db/tables/topk.txtpb}
kreg=build/release/bin/kreg
for d in batch=128,n=201088,k=64 batch=32,n=201088,k=64 batch=8,n=201088,k=64 batch=1,n=201088,k=64 \
         batch=64,n=32768,k=2048 batch=64,n=32768,k=256 batch=64,n=32768,k=16 batch=1,n=1000000,k=100 \
         batch=16,n=4096,k=8 batch=16,n=4096,k=512 batch=128,n=32000,k=50 batch=32,n=128000,k=8; do
  $kreg tune topk --dims $d --db "$db" --strategy halving --budget 60 --timeout 20
done
for d in batch=128,n=201088,k=64 batch=64,n=32768,k=2048 batch=1,n=1000000,k=100; do
  $kreg tune topk --dims $d --dtype bf16 --db "$db" --strategy halving --budget 60 --timeout 20
done
