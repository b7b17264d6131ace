#!/usr/bin/env bash
# kreg's main job on a fresh Debian 12 machine: install what is missing,
# build every op family's plugins, tune top-k on a few shapes into a table
# (a minute or two), then answer queries from it and run what it picks; the
# same for a grouped matmul with skewed group sizes (an MoE layer) and an
# all-reduce on 4 thread ranks, and once under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
# deps.sh installs Open MPI, so the mpi backend (kreg_mpi) is built too.
# kreg_plugins: every family's plugins (plugins/*/).
cmake --build --preset release --target kreg kreg_plugins kreg_worker kreg_mpi
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
$kreg query topk --db data/tables/amd-epyc-avx2-2c.txtpb --dims batch=100,n=150000,k=64
echo "== a run dispatched by the table, checked"
$kreg run topk --db "$db" --dims batch=48,n=40000,k=64 --check
echo "== a small family kept in one folder (plugins/transpose): its tiled kernel, checked"
$kreg run transpose/blocked --dims rows=1000,cols=777 --param tile=64 --check
echo "== a grouped matmul (MoE, skewed group sizes): tuned, queried (the shape and a larger one), dispatched"
$kreg tune gmm --db "$db" --strategy halving --budget 20 --dims m=2048,k=512,n=512,groups=16 --partition skewed
$kreg query gmm --db "$db" --data-class skewed --dims m=2048,k=512,n=512,groups=16 --dims m=4096,k=512,n=512,groups=16
$kreg run gmm --db "$db" --partition skewed --dims m=2048,k=512,n=512,groups=16 --check
echo "== a collective: all-reduce on 4 thread ranks, tuned, calibrated, queried, dispatched"
$kreg run allreduce/ring --ranks 4 --dims count=1000000 --check
$kreg tune allreduce --ranks 4 --db "$db" --strategy exhaustive \
  --dims count=256 --dims count=65536 --dims count=4194304
$kreg calibrate --db "$db"   # the backend's alpha-beta-gamma costs: untuned shapes answer by the model
$kreg query allreduce --ranks 4 --db "$db" --dims count=256 --dims count=1000000
$kreg query allgather --ranks 4 --db "$db" --dims count=100 --dims count=1000000   # nothing tuned: the model
$kreg run allreduce --ranks 4 --db "$db" --dims count=1000000 --check
if [ -f build/release/lib/kreg/backends/kreg_mpi.so ]; then
  echo "== the same all-reduce as 3 MPI processes (the table's key differs: backend=mpi,nodes=1)"
  root=""
  [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
  mpirun $root --oversubscribe -n 3 $kreg run allreduce/ring --backend mpi --dims count=1000 --check
fi
