#!/usr/bin/env bash
# Issue 26's checks on the lent GPU machine (one H100 beside a 16-core Xeon
# with AVX-512, AVX512_BF16 and AMX), in one call of the device tool:
#
#   step              limit  what
#   gpu                 30 s what kreg sees (nvidia-smi, kreg machine, lscpu)
#                            and the CUDA backend's test (device_test)
#   cuda-conformance   120 s every CUDA kernel (topk/cuda_radix, gmm and tgmm
#                            cuda_grouped and cuda_cublas) against the CPU
#                            reference: every configuration the tuner
#                            searches, top-k's adversarial rows, the grouped
#                            partitions (empty groups, mid-tile starts,
#                            offsets, transposed rhs, existing_out, f32/bf16)
#   sanitizer           70 s compute-sanitizer memcheck and racecheck, small
#                            grids of each CUDA kernel
#   gpu-peers          100 s bench/gpu_peers.py: the issue's workloads, kreg
#                            (tuned, 6 s each) against torch.topk and
#                            torch._grouped_mm, cold L2, CUDA events
#   profile             40 s per-kernel GPU times (ncu, else nsys) of the
#                            workloads gpu-peers measures, at the configurations
#                            its table chose: where a goal is missed, which
#                            kernel the time goes to
#   xeon-conformance    70 s the gmm/tgmm conformance suite on this CPU: each
#                            micro-kernel it has the ISA for (avx512,
#                            avx512bf16, amx), then gmm/onednn
#   xeon-gmm-bench      55 s gmm_bench at 16 threads: gmm/tgmm, skewed then
#                            balanced, f32 and bf16, each micro-kernel against
#                            oneDNN per group and dense
#   xeon-torch          40 s bench/cpu_grouped_peers.py: kreg against
#                            torch._grouped_mm on the CPU, 16 threads
#   cuda-arrays         45 s scripts/gpu_arrays.py: CUDA tensors taken in place
#                            by kreg.run, Dispatcher.run and torch.ops.kreg on
#                            the caller's stream, and kreg.jax's CUDA custom
#                            calls under jax.jit, with the bundle's Python
#                            package built for PYTHON (python-cp312/ for the
#                            GPU machine's CPython 3.12 and torch 2.11;
#                            python/ for the build's own Python)
#   sweeps              40 s kreg tune --device cuda into one table beside a
#                            CPU entry, and what the table answers
# The limits add up to 610 s; the run also stops starting steps once
# GPU_CHECK_BUDGET seconds (default 570) have gone, so that the call fits
# in the device tool's 10 minutes. A step that fails or runs out of time is
# recorded and the next one runs; steps that need a GPU skip at once
# without one. The sweeps are last: the cheapest to lose.
#
# Everything a step prints goes to stdout and to OUT/NN-STEP.log; tables,
# JSON and test reports go to OUT too (OUT: $OUT where the device tool sets
# it, else build/gpu-check-out), and OUT/summary.md ends it: step, status,
# seconds. Exits 0 if every step passed, 1 otherwise (no GPU included).
#
#   scripts/gpu_check.sh                      # every step
#   scripts/gpu_check.sh xeon-torch sweeps    # only these steps
#   KREG_PREFIX=build/release scripts/gpu_check.sh   # a build tree, not the bundle
# KREG_PREFIX: the bundle (build/gpu-bundle, made by scripts/gpu_bundle.sh)
# if it is there, else build/release. PYTHON: the Python with PyTorch
# (python3); kreg's Python package is the one of PREFIX/python* whose _kreg
# is built for it (its extension suffix). CPU_THREADS: the Xeon steps'
# threads (16, or all the cores if fewer). GPU_CHECK_QUICK=1: the Xeon
# benchmarks on gmm's skewed shape only, for a dry run on a small machine.
set -u
cd "$(dirname "$0")/.."
prefix=${KREG_PREFIX:-}
[ -n "$prefix" ] || { [ -d build/gpu-bundle ] && prefix=build/gpu-bundle || prefix=build/release; }
prefix=$(cd "$prefix" && pwd) || exit 1
# The bundle's libraries travel packed (scripts/gpu_bundle.sh): unpacked for
# this run into a scratch folder, so the bundle stays as carried.
deps=$prefix/deps
if [ -f "$prefix/deps.tar.gz" ] && [ ! -d "$deps" ]; then
  deps=$(mktemp -d "${TMPDIR:-/tmp}/kreg-deps.XXXXXX") || exit 1
  trap 'rm -rf "$deps"' EXIT
  tar -C "$deps" --strip-components=1 -xzf "$prefix/deps.tar.gz" ||
    { echo "gpu_check: cannot unpack $prefix/deps.tar.gz" >&2; exit 1; }
fi
out=${OUT:-build/gpu-check-out}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
export prefix out
export kreg=$prefix/bin/kreg
export PYTHON=${PYTHON:-python3}
cores=$(nproc)
export CPU_THREADS=${CPU_THREADS:-$((cores < 16 ? cores : 16))}
export GPU_CHECK_QUICK=${GPU_CHECK_QUICK:-0}
export LD_LIBRARY_PATH="$prefix/lib:$deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KREG_PLUGIN_PATH=$prefix/lib/kreg/plugins${KREG_PLUGIN_PATH:+:$KREG_PLUGIN_PATH}  # gmm_bench reads it
# cuBLAS (gmm/cuda_cublas loads it at run time): the system's, else a
# PyTorch wheel's (where PYTHON's torch is, or a usual place).
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13; then
  site=$(timeout 20 "$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
  cublas=$(find $site /usr/local/cuda*/lib64 /usr/lib /opt /usr/local/lib -name libcublas.so.13 2>/dev/null | head -1)
  [ -n "$cublas" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cublas")"
fi
# The kreg package built for PYTHON: the PREFIX/python* folder whose _kreg
# has PYTHON's extension suffix (scripts/gpu_bundle.sh packs python/ for the
# build's Python and python-cp312/ for the GPU machine's); none, if none is.
python_suffix=$(timeout 20 "$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
python_pkg=
for dir in "$prefix"/python "$prefix"/python-*; do
  if [ -n "$python_suffix" ] && [ -e "$dir/kreg/_kreg$python_suffix" ]; then
    python_pkg=$dir
    break
  fi
done
export python_suffix python_pkg

# Whether there is a GPU to check, asked once; the GPU steps skip without.
gpu_line=$(timeout 20 "$kreg" machine 2>&1 | grep '^gpus')
if timeout 20 "$kreg" machine --json 2>/dev/null | grep -q '"gpus":\[{'; then
  export HAVE_GPU=1
else
  export HAVE_GPU=0
fi
export gpu_line

# ---- The steps: each a function, run below under its own timeout. ---------------
# Exit 77 is "skipped" (what it needs is not here; it fails nothing), 3
# "no GPU" (step gpu: a failure).
needs_gpu() {
  [ "$HAVE_GPU" = 1 ] && return 0
  echo "no GPU: skipped (kreg machine: ${gpu_line:-nothing})"
  exit 77
}
export -f needs_gpu

step_gpu() {
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  else
    echo "nvidia-smi: not installed"
  fi
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L2|L3)'
  grep -o -w -E 'avx512f|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort | uniq -c
  "$kreg" machine
  "$kreg" machine --json > "$out/machine.json"
  if [ "$HAVE_GPU" != 1 ]; then
    echo "no GPU: the GPU steps skip"
    exit 3
  fi
  KREG_TEST_BIN="$kreg" "$prefix/bin/device_test" --gtest_output="xml:$out/device_test.xml"
}

step_cuda_conformance() {
  needs_gpu
  KREG_CONFORMANCE_PLUGINS=$prefix/lib/kreg/plugins:$prefix/test_plugins/axpy:$prefix/test_plugins/rowsum \
    "$prefix/bin/conformance_test" --gtest_filter='*cuda*:DeviceArgs*:TopKConformanceTest.*' \
    --gtest_output="xml:$out/cuda_conformance.xml"
}

step_sanitizer() {
  needs_gpu
  local sanitizer failed=0 tool dtype variant
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$sanitizer" ] || { echo "compute-sanitizer: not found (PATH, /usr/local/cuda*/bin)"; exit 1; }
  "$sanitizer" --version | tail -1
  san() {  # one sanitized kreg run; a report or a failed check fails the step
    echo "-- $tool: kreg $*"
    "$sanitizer" --tool "$tool" --error-exitcode 3 "$kreg" "$@" --device cuda --check --reps 1 --warmup 0 ||
      { echo "FAILED ($?): $tool kreg $*"; failed=1; }
  }
  for tool in memcheck racecheck; do
    for dtype in f32 bf16; do
      san run topk/cuda_radix --dims batch=5,n=3001,k=37 --dtype $dtype --with row_ends
    done
    for variant in cuda_grouped cuda_cublas; do
      san run gmm/$variant --dims m=300,k=70,n=130,groups=5,transpose_rhs=1 --dtype bf16 --with existing_out
      san run tgmm/$variant --dims k=70,m=300,n=130,groups=5 --dtype bf16
    done
  done
  exit $failed
}

step_gpu_peers() {
  needs_gpu
  "$PYTHON" -c "import torch; assert torch.cuda.is_available()" ||
    { echo "PyTorch with CUDA not found ($PYTHON)"; exit 1; }
  "$PYTHON" -u bench/gpu_peers.py --kreg "$kreg" --db "$out/gpu_peers.txtpb" --budget 6 --reps 20 |
    tee "$out/gpu_peers.md"
  exit "${PIPESTATUS[0]}"
}

step_profile() {
  needs_gpu
  local tool
  tool=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  [ -n "$tool" ] || tool=$(command -v nsys || ls /usr/local/cuda*/bin/nsys 2>/dev/null | head -1)
  [ -n "$tool" ] || { echo "neither ncu nor nsys found: skipped"; exit 77; }
  prof() {  # one run, every kernel's time on the GPU
    echo "-- $(basename "$tool"): kreg run $*"
    if [ "$(basename "$tool")" = ncu ]; then
      "$tool" --metrics gpu__time_duration.sum --print-summary per-kernel "$kreg" run "$@" --device cuda \
        --warmup 0 --reps 1 2>&1 | grep -E 'gpu__time_duration|^ +[A-Za-z_].*\(|median' | cut -c1-160 | head -60
    else
      "$tool" profile --stats=true -o "$out/profile-$RANDOM" "$kreg" run "$@" --device cuda --warmup 0 --reps 1 2>&1 |
        sed -n '/cuda_gpu_kern_sum/,/^$/p' | head -30
    fi
  }
  prof topk/cuda_radix --dims batch=64,n=32768,k=2048 --param bits=8 --param block=1024 --param capacity=0 \
    --param blocks_per_row=1 --param rows_per_block=1
  prof topk/cuda_radix --dims batch=128,n=201088,k=64 --param bits=4 --param block=1024 --param capacity=2048 \
    --param blocks_per_row=4 --param rows_per_block=1
  prof gmm/cuda_cublas --dims m=4096,k=2048,n=1024,groups=64 --dtype bf16 --partition skewed
  prof gmm/cuda_cublas --dims m=4096,k=2048,n=1024,groups=64 --dtype bf16 --partition skewed --param mode=per_group
  prof gmm/cuda_grouped --dims m=4096,k=2048,n=1024,groups=64 --dtype bf16 --partition skewed
  rm -f "$out"/profile-*
  exit 0
}

step_xeon_conformance() {
  local plugins=$prefix/lib/kreg/plugins failed=0
  "$kreg" machine | grep -E '^(class|isa|cores)'
  # The micro-kernels first (the point of this step), then gmm/onednn.
  KREG_CONFORMANCE_PLUGINS=$plugins "$prefix/bin/conformance_test" \
    --gtest_filter='Gmm*:Tgmm*:*gmm_tiled' --gtest_output="xml:$out/xeon_conformance_tiled.xml" || failed=1
  KREG_CONFORMANCE_PLUGINS=$plugins "$prefix/bin/conformance_test" \
    --gtest_filter='*gmm_onednn' --gtest_output="xml:$out/xeon_conformance_onednn.xml" || failed=1
  exit $failed
}

step_xeon_gmm_bench() {
  local shape shapes='skewed balanced' rc=0 left
  [ "$GPU_CHECK_QUICK" = 1 ] && shapes=skewed
  # The skewed shape first (the issue's goals are on it), each shape in its
  # own run so a timeout keeps what finished; kreg's choice, each
  # micro-kernel this CPU has (not generic), oneDNN per group and dense; not
  # the prepacked and pack-time rows.
  for shape in $shapes; do
    left=$((STEP_LIMIT - 3 - SECONDS))
    [ "$left" -gt 5 ] || { echo "gmm_bench $shape: no time left"; rc=124; break; }
    timeout "$left" "$prefix/bin/gmm_bench" --threads="$CPU_THREADS" --micros=all --benchmark_min_time=0.1 \
      --benchmark_filter="^BM_t?gmm/$shape/(f32|bf16)/(tiled|onednn|tiled_(avx2|avx512|avx512bf16|amx)|onednn_direct|onednn_dense)/" \
      --benchmark_out="$out/gmm_bench_$shape.json" --benchmark_out_format=json || rc=$?
    "$PYTHON" bench/ratios.py "$out/gmm_bench_$shape.json" > "$out/gmm_bench_$shape.md" &&
      cat "$out/gmm_bench_$shape.md" || echo "gmm_bench $shape: no complete JSON; the figures are above"
  done
  exit $rc
}

step_xeon_torch() {
  local only='' reps=10
  [ "$GPU_CHECK_QUICK" = 1 ] && only='^gmm skewed' reps=3
  "$PYTHON" -u bench/cpu_grouped_peers.py --kreg "$kreg" --threads "$CPU_THREADS" --reps $reps --only "$only" |
    tee "$out/cpu_grouped_peers.md"
  exit "${PIPESTATUS[0]}"
}

step_sweeps() {
  needs_gpu
  local table=$out/gpu_sweeps.txtpb failed=0
  rm -f "$table"
  k() { echo "-- kreg $*" >&2; "$kreg" "$@" || { echo "FAILED ($?): kreg $*"; failed=1; }; }
  k tune topk --device cuda --dims batch=16,n=50000,k=64 --dims batch=4,n=4096,k=512 --budget 6 --db "$table"
  k tune gmm --device cuda --dims m=2048,k=512,n=512,groups=8 --dtype bf16 --budget 6 --db "$table"
  k tune tgmm --device cuda --dims k=512,m=2048,n=512,groups=8 --dtype bf16 --budget 6 --db "$table"
  k tune topk --dims batch=16,n=50000,k=64 --variants heap --budget 4 --db "$table"  # the CPU entry
  k db show "$table" > "$out/gpu_sweeps.md"
  cat "$out/gpu_sweeps.md"
  k query topk --device cuda --dims batch=16,n=50000,k=64 --dims batch=8,n=40000,k=64 --db "$table" --no-shipped
  k query topk --dims batch=16,n=50000,k=64 --db "$table" --no-shipped
  k query gmm --device cuda --dims m=2048,k=512,n=512,groups=8 --dtype bf16 --db "$table" --no-shipped
  exit $failed
}
step_cuda_arrays() {
  # The package built for PYTHON (python_pkg, above); its torch shim is built
  # for one torch version: with another it says so and skips.
  if [ -z "$python_pkg" ]; then
    echo "no kreg package in $prefix for $PYTHON (_kreg${python_suffix:-?}): skipped"
    exit 77
  fi
  echo "kreg package for $PYTHON: $python_pkg"
  needs_gpu
  PYTHONPATH=$python_pkg "$PYTHON" -c '
import sys, torch
try:
    import kreg.torch
except Exception as e:
    sys.exit(f"kreg.torch does not import with torch {torch.__version__} ({type(e).__name__}: {e}): skipped")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no GPU: skipped")
print(f"torch {torch.__version__}; {kreg.torch.__file__}")' 2>&1 || exit 77
  PYTHONPATH=$python_pkg "$PYTHON" -u scripts/gpu_arrays.py
}
export -f step_gpu step_cuda_conformance step_sanitizer step_gpu_peers step_xeon_conformance \
  step_xeon_gmm_bench step_xeon_torch step_cuda_arrays step_sweeps step_profile

# ---- Running them ----------------------------------------------------------------
steps=(gpu:30 cuda-conformance:120 sanitizer:70 gpu-peers:100 profile:40 xeon-conformance:70 xeon-gmm-bench:55
       xeon-torch:40 cuda-arrays:45 sweeps:40)
budget=${GPU_CHECK_BUDGET:-570}
names=() statuses=() seconds=()
failures=0
echo "gpu_check: prefix $prefix, output $out, $cores cores (Xeon steps: $CPU_THREADS threads), GPU: $HAVE_GPU," \
  "Python package: ${python_pkg:-none for $PYTHON}," \
  "budget ${budget} s"
number=0
for entry in "${steps[@]}"; do
  name=${entry%%:*} limit=${entry##*:}
  number=$((number + 1))
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  left=$((budget - SECONDS))
  [ "$limit" -gt "$left" ] && limit=$left
  log=$(printf '%s/%02d-%s.log' "$out" "$number" "$name")
  echo
  echo "== $number. $name (at most $limit s; log $log)"
  start=$SECONDS
  if [ "$limit" -lt 10 ]; then
    echo "not started: $left s of the budget left" | tee "$log"
    status="NO TIME"
  else
    STEP_LIMIT=$limit timeout -k 10 "$limit" bash -c "step_${name//-/_}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    case $rc in
      0) status=ok ;;
      77) status=skipped ;;
      3) status="FAILED (no GPU)" ;;
      124 | 137) status="TIMED OUT" ;;
      *) status="FAILED ($rc)" ;;
    esac
  fi
  [ "$status" = ok ] || [ "$status" = skipped ] || failures=$((failures + 1))
  echo "== $number. $name: $status, $((SECONDS - start)) s" | tee -a "$log"
  names+=("$number. $name") statuses+=("$status") seconds+=($((SECONDS - start)))
done

{
  echo "| step | status | seconds |"
  echo "|---|---|---:|"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${statuses[$i]} | ${seconds[$i]} |"
  done
  echo
  echo "$failures failed; $SECONDS s in all; $(date -u '+%Y-%m-%d %H:%M UTC'); $(hostname)"
} > "$out/summary.md"
echo
echo "== summary ($out/summary.md)"
cat "$out/summary.md"
[ "$failures" -eq 0 ]
