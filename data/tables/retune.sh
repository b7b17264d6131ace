#!/usr/bin/env bash
# Re-tunes the table shipped for this machine's class: every op family's
# shapes below, measured into a scratch table, then slimmed into
# data/tables/<class>.txtpb — per problem, each variant's best
# configuration per combination of its named choices (a choice may need an
# ISA) and its measurements, not every trial. The class is what
# `kreg machine` names it: CPU model, core generation, widest vector ISA and
# core count (e.g. amd-epyc-zen3-avx2-2c). Tables of other classes stay as
# they are: kreg answers from the most similar one where this machine has
# none, and derives its measured defaults from all of them.
#   top-k: the seed shapes and a spread around them, f32, and the seed
#     shapes in bf16;
#   gmm and tgmm: three MoE shapes with balanced and skewed group sizes,
#     which are tuned apart as the data classes "balanced" and "skewed",
#     f32, and the benchmark's two in bf16;
#   collectives: all-reduce, all-gather and reduce-scatter on 2 and 4 thread
#     ranks at three sizes, and the collective matmul on a 2x1 mesh.
# About 25 minutes on 2 cores. Usage: [KREG=path/to/kreg] data/tables/retune.sh [TABLE]
# The table starts with a provenance header (# lines: machine, command,
# commit, date), which the text format reads as comments.
set -euo pipefail
cd "$(dirname "$0")/../.."
kreg=${KREG:-build/release/bin/kreg}
class=$($kreg machine | sed -n 's/^class *//p')
out=${1:-data/tables/$class.txtpb}
# Every trial goes into this table first: a run that stops (a failure, a
# kill) resumes when started again, from the first problem it has no
# finished entry for, and within it from its checkpointed measurements.
db=build/retune-$class.lut
mkdir -p build
tune() {  # OP FLAGS...: one problem, unless the table has its finished entry
  local query=("${@/--partition/--data-class}")
  if $kreg query "${query[@]}" --db "$db" --no-shipped --machine strict --json 2>/dev/null |
      grep -q '"match":"exact","incomplete":false'; then
    echo "already tuned: $*"
    return
  fi
  $kreg tune "$@" --db "$db" --strategy halving --budget 60 --timeout 20
}
for d in batch=128,n=201088,k=64 batch=32,n=201088,k=64 batch=8,n=201088,k=64 batch=1,n=201088,k=64 \
         batch=64,n=32768,k=2048 batch=64,n=32768,k=256 batch=64,n=32768,k=16 batch=1,n=1000000,k=100 \
         batch=16,n=4096,k=8 batch=16,n=4096,k=512 batch=128,n=32000,k=50 batch=32,n=128000,k=8; do
  tune topk --dims $d
done
for d in batch=128,n=201088,k=64 batch=64,n=32768,k=2048 batch=1,n=1000000,k=100; do
  tune topk --dims $d --dtype bf16
done
for op in gmm tgmm; do
  for d in m=8192,k=2048,n=1024,groups=8 m=4096,k=2048,n=1024,groups=64 m=2048,k=1024,n=4096,groups=32; do
    for p in balanced skewed; do
      tune $op --dims $d --partition $p
    done
  done
  tune $op --dims m=8192,k=2048,n=1024,groups=8 --partition balanced --dtype bf16
  tune $op --dims m=4096,k=2048,n=1024,groups=64 --partition skewed --dtype bf16
done
for op in allreduce allgather reduce_scatter; do
  for ranks in 2 4; do
    for count in 4096 262144 4194304; do
      tune $op --ranks $ranks --dims count=$count
    done
  done
done
tune sharded_matmul --mesh 2x1 --ranks 2 --dims m=512,k=512,n=512
$kreg db slim "$db" "$out.body.txtpb"
machine=$($kreg machine | sed -n -e 's/^model *//p' -e 's/^vendor *//p' -e 's/^isa *//p' -e 's/^cores *\(.*\)/\1 cores/p' |
  paste -sd';' | sed 's/;/; /g')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!data/tables' 2>/dev/null || commit="$commit with local changes"
{
  echo "# kreg shipped table, machine class $class"
  echo "# machine: $machine"
  echo "# command: ${KREG:+KREG=$KREG }data/tables/retune.sh${1:+ $1}"
  echo "# commit: $commit"
  echo "# date: $(date -u +%Y-%m-%d)"
  cat "$out.body.txtpb"
} >"$out"
rm -f "$out.body.txtpb" "$out.body.txtpb.lock"
rm -f "$db" "$db.lock" "$out.lock"
echo "wrote $out"
