#!/usr/bin/env bash
# The GPU checks in one call, on a machine with an NVIDIA GPU:
#  1. what kreg sees of it, and the device backend's test (memory, copies
#     both ways, the L2 flush, event timing);
#  2. every CUDA kernel (topk/cuda_radix, gmm and tgmm cuda_grouped and
#     cuda_cublas) against the CPU reference through the conformance
#     suite: each configuration the tuner searches, top-k's adversarial
#     rows (NaN of both signs, ±inf, ±0, ties, ragged and empty rows, bf16),
#     the grouped matmuls' partitions (empty groups, groups that start
#     mid-tile, offsets, transposed rhs, existing_out, f32 and bf16 out);
#  3. compute-sanitizer (memcheck and racecheck) on a small grid of each,
#     where it is found (on PATH, in the CUDA toolkit, or the wheel
#     scripts/gpu_bundle.sh packs);
#  4. sweeps on the GPU (kreg tune --device cuda) into one table beside a
#     CPU entry, and what the table answers for the GPU;
#  5. where PyTorch is installed, bench/gpu_peers.py: kreg's tuned choice
#     against torch.topk and torch._grouped_mm on the issue's workloads;
#  6. where PyTorch is installed and the build has the Python package,
#     scripts/gpu_arrays.py: CUDA tensors taken in place by kreg.run,
#     Dispatcher.run and torch.ops.kreg on the caller's stream (under its
#     own timeout; a failure is reported and the script goes on to exit 1).
# Run from the repository root, on a build tree or on the bundle
# scripts/gpu_bundle.sh makes (carried to the lent device):
#   scripts/gpu_check.sh                      # build/gpu-bundle, else build/release
#   KREG_PREFIX=build/release scripts/gpu_check.sh
# Exits non-zero if a check fails, or if there is no GPU to check.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${KREG_PREFIX:-}
[ -n "$prefix" ] || { [ -d build/gpu-bundle ] && prefix=build/gpu-bundle || prefix=build/release; }
export LD_LIBRARY_PATH="$PWD/$prefix/lib:$PWD/$prefix/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuBLAS (gmm/cuda_cublas loads it at run time): the system's, else a
# PyTorch wheel's.
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13; then
  cublas=$(find /usr/local/cuda*/lib64 /usr/lib /opt /usr/local/lib -name libcublas.so.13 2>/dev/null | head -1 || true)
  [ -n "$cublas" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cublas")"
fi
kreg="$prefix/bin/kreg"
step() { echo; echo "== $*"; }

step "1. the GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
"$kreg" machine
"$kreg" machine --json | grep -q '"gpus":\[{' || { echo "gpu_check: kreg sees no GPU" >&2; exit 1; }
KREG_TEST_BIN="$kreg" "$prefix/bin/device_test"

step "2. every CUDA kernel against the CPU reference"
conformance=$PWD/$prefix/lib/kreg/plugins:$PWD/$prefix/test_plugins/axpy:$PWD/$prefix/test_plugins/rowsum
[ -d "$prefix/test_plugins" ] || conformance=
KREG_CONFORMANCE_PLUGINS=$conformance "$prefix/bin/conformance_test" \
  --gtest_filter='*cuda*:DeviceArgs*:TopKConformanceTest.*'

step "3. compute-sanitizer"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -z "$sanitizer" ] && [ -f "$prefix/tools/compute-sanitizer.whl" ]; then
  rm -rf /tmp/kreg-sanitizer && python3 -m zipfile -e "$prefix/tools/compute-sanitizer.whl" /tmp/kreg-sanitizer
  sanitizer=/tmp/kreg-sanitizer/nvidia/cu13/bin/compute-sanitizer
  chmod +x "$sanitizer"
fi
if [ -z "$sanitizer" ]; then
  echo "compute-sanitizer: not found (scripts/gpu_bundle.sh packs it): skipped"
else
  for tool in memcheck racecheck; do
    for dtype in f32 bf16; do
      "$sanitizer" --tool $tool --error-exitcode 3 "$kreg" run topk/cuda_radix --device cuda --check --reps 1 \
        --warmup 0 --dims batch=5,n=3001,k=37 --dtype $dtype --with row_ends
    done
    for variant in cuda_grouped cuda_cublas; do
      "$sanitizer" --tool $tool --error-exitcode 3 "$kreg" run gmm/$variant --device cuda --check --reps 1 \
        --warmup 0 --dims m=300,k=70,n=130,groups=5,transpose_rhs=1 --dtype bf16 --with existing_out
      "$sanitizer" --tool $tool --error-exitcode 3 "$kreg" run tgmm/$variant --device cuda --check --reps 1 \
        --warmup 0 --dims k=70,m=300,n=130,groups=5 --dtype bf16
    done
  done
fi

step "4. sweeps on the GPU, beside the CPU's"
table=$(mktemp -d)/gpu.txtpb
"$kreg" tune topk --device cuda --dims batch=16,n=50000,k=64 --dims batch=4,n=4096,k=512 --db "$table"
"$kreg" tune gmm --device cuda --dims m=2048,k=512,n=512,groups=8 --dtype bf16 --db "$table"
"$kreg" tune tgmm --device cuda --dims k=512,m=2048,n=512,groups=8 --dtype bf16 --db "$table"
"$kreg" tune topk --dims batch=16,n=50000,k=64 --variants heap --db "$table"
"$kreg" db show "$table"
"$kreg" query topk --device cuda --dims batch=16,n=50000,k=64 --dims batch=8,n=40000,k=64 --db "$table" --no-shipped
"$kreg" query topk --dims batch=16,n=50000,k=64 --db "$table" --no-shipped

step "5. against PyTorch"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 bench/gpu_peers.py --kreg "$kreg" --db "$(dirname "$table")/peers.txtpb"
else
  echo "PyTorch with CUDA not found: skipped"
fi

step "6. CUDA tensors in place, on the caller's stream"
failed=0
if [ ! -d "$prefix/python/kreg" ]; then
  echo "no Python package in $prefix: skipped"
elif python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  PYTHONPATH="$PWD/$prefix/python" timeout 300 python3 scripts/gpu_arrays.py || { echo "step 6 failed"; failed=1; }
else
  echo "PyTorch with CUDA not found: skipped"
fi
exit $failed
