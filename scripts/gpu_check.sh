#!/usr/bin/env bash
# The GPU checks in one call, on a machine with an NVIDIA GPU: what kreg
# sees of it, and the device backend's test (memory, copies both ways, the
# L2 flush, event timing). Run from the repository root, on a build tree or
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
