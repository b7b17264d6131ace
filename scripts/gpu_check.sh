#!/usr/bin/env bash
# The GPU checks in one call, on a machine with an NVIDIA GPU: what kreg
# sees of it; the device backend's test (memory, copies both ways, the L2
# flush, event timing); every CUDA kernel against the CPU reference through
# the conformance suite (each configuration the tuner searches, top-k's
# adversarial rows: NaN of both signs, ±inf, ±0, ties, ragged and empty
# rows, bf16); and a timed run of each. Run from the repository root, on a build tree or
# on the bundle scripts/gpu_bundle.sh makes (carried to the lent device):
#   scripts/gpu_check.sh                      # build/gpu-bundle, else build/release
#   KREG_PREFIX=build/release scripts/gpu_check.sh
# Exits non-zero if a check fails, or if there is no GPU to check.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${KREG_PREFIX:-}
[ -n "$prefix" ] || { [ -d build/gpu-bundle ] && prefix=build/gpu-bundle || prefix=build/release; }
export LD_LIBRARY_PATH="$PWD/$prefix/lib:$PWD/$prefix/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
"$prefix/bin/kreg" machine
"$prefix/bin/kreg" machine --json | grep -q '"gpus":\[{' || { echo "gpu_check: kreg sees no GPU" >&2; exit 1; }
KREG_TEST_BIN="$prefix/bin/kreg" "$prefix/bin/device_test"
conformance=$PWD/$prefix/lib/kreg/plugins:$PWD/$prefix/test_plugins/axpy:$PWD/$prefix/test_plugins/rowsum
[ -d "$prefix/test_plugins" ] || conformance=
KREG_CONFORMANCE_PLUGINS=$conformance "$prefix/bin/conformance_test" \
  --gtest_filter='*cuda*:DeviceArgs*:TopKConformanceTest.*'
for dtype in f32 bf16; do
  "$prefix/bin/kreg" run topk/cuda_radix --device cuda --dims batch=128,n=201088,k=64 --dtype $dtype --check
  "$prefix/bin/kreg" run topk/cuda_radix --device cuda --dims batch=64,n=32768,k=2048 --dtype $dtype --check
done
