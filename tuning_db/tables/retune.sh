#!/usr/bin/env bash
# Re-tunes the table shipped for this machine's class: every op's shapes
# below (top-k: the seed shapes and a spread around them, f32, and the seed
# shapes in bf16; gmm and tgmm: three MoE shapes with balanced and skewed
# group sizes, which are tuned apart as the data classes "balanced" and
# "skewed", f32, and the benchmark's two in bf16), measured into a scratch
# table, then slimmed into
# tuning_db/tables/<class>.txtpb — per problem, each variant's best
# configuration and its measurements, not every trial. The class is the CPU
# model, its widest vector ISA and the core count (e.g. amd-epyc-avx2-2c).
# About 20 minutes on 2 cores. Usage: tuning_db/tables/retune.sh [TABLE]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=avx2
grep -qw avx512f /proc/cpuinfo && isa=avx512
grep -qw avx2 /proc/cpuinfo || isa=sse
class=$(printf '%s-%s-%sc' "$model" "$isa" "$(nproc)" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//;s/-$//')
out=${1:-tuning_db/tables/$class.txtpb}
kreg=build/release/bin/kreg
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
db=$scratch/all.lut
for d in batch=128,n=201088,k=64 batch=32,n=201088,k=64 batch=8,n=201088,k=64 batch=1,n=201088,k=64 \
         batch=64,n=32768,k=2048 batch=64,n=32768,k=256 batch=64,n=32768,k=16 batch=1,n=1000000,k=100 \
         batch=16,n=4096,k=8 batch=16,n=4096,k=512 batch=128,n=32000,k=50 batch=32,n=128000,k=8; do
  $kreg tune topk --dims $d --db "$db" --strategy halving --budget 60 --timeout 20
done
for d in batch=128,n=201088,k=64 batch=64,n=32768,k=2048 batch=1,n=1000000,k=100; do
  $kreg tune topk --dims $d --dtype bf16 --db "$db" --strategy halving --budget 60 --timeout 20
done
for op in gmm tgmm; do
  for d in m=8192,k=2048,n=1024,groups=8 m=4096,k=2048,n=1024,groups=64 m=2048,k=1024,n=4096,groups=32; do
    for p in balanced skewed; do
      $kreg tune $op --dims $d --partition $p --db "$db" --strategy halving --budget 60 --timeout 20
    done
  done
  $kreg tune $op --dims m=8192,k=2048,n=1024,groups=8 --partition balanced --dtype bf16 --db "$db" \
      --strategy halving --budget 60 --timeout 20
  $kreg tune $op --dims m=4096,k=2048,n=1024,groups=64 --partition skewed --dtype bf16 --db "$db" \
      --strategy halving --budget 60 --timeout 20
done
$kreg db slim "$db" "$out"
echo "wrote $out"
