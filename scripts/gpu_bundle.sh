#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs into build/gpu-bundle, to carry to
# the lent GPU machine (one H100 beside a 16-core AVX-512/AMX Xeon, no
# network, compute-sanitizer installed) as one carry path of at most 64 MiB:
#   bin/      kreg, device_test, conformance_test, gmm_bench
#   lib/      libkreg_registry, the plugins (gmm/onednn included), the CUDA
#             backend (not the MPI one: no check uses it, and Open MPI's
#             libraries would cost 5 MB)
#   libexec/, share/ (the worker, the shipped tables)
#   test_plugins/  axpy/ and rowsum/, the conformance suite's (not the
#             loader's and hardening tests' broken plugins: 0.7 MB)
#   deps.tar.gz  deps/: every library they link but the C runtime's own,
#             which that machine has: Abseil, protobuf, oneTBB, OpenMP, Google
#             Benchmark, oneDNN (libdnnl, ~40 MB of its ~46); packed with
#             gzip (which every machine has) to leave the carry room, and
#             unpacked into a scratch folder by scripts/gpu_check.sh
#   python/   the build's kreg Python package (step cuda-arrays): _kreg for
#             the build's Python (3.11), _kreg_torch.so for its torch
#             (build/venv), libkreg_xla.so
#   python-cp312/  the same package for the GPU machine's Python, CPython
#             3.12 with torch 2.11 (/opt/torch/.venv), where python/ does
#             not import: _kreg built for 3.12 and _kreg_torch.so
#             against that torch's libtorch (not torch's own libraries: that
#             machine has them), libkreg_xla.so copied (a C ABI, the same
#             for any Python); ~2 MB. Built here in build/gpu-cp312/ from
#             this checkout (only the Python targets) where GPU_PYTHON, a
#             CPython 3.12 with its headers, is found (default pyenv's
#             /root/.pyenv/versions/3.12.1/bin/python3), against the torch
#             wheel GPU_TORCH (default 2.11.0) that pip downloads once
#             (--no-deps; only its headers and libtorch, libtorch_cpu, libc10
#             are unpacked); else left out, saying so in one line.
#             scripts/gpu_check.sh picks the package built for PYTHON.
# Copies of our own files are stripped (--strip-unneeded); the Debian
# libraries already are. Prints the size and fails past 60 MiB.
# Run after a release build (BUILD names another build tree, from these
# same sources: the 3.12 package links its own build of libkreg_registry
# but runs on BUILD's):
#   scripts/gpu_bundle.sh
#   BUILD=/path/to/build/release scripts/gpu_bundle.sh
#   GPU_PYTHON=/path/to/python3.12 GPU_TORCH=2.11.0 scripts/gpu_bundle.sh
# JOBS: the 3.12 build's parallel jobs (default: the cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build/release}
out=build/gpu-bundle
limit_mib=60
for f in bin/kreg bin/device_test bin/conformance_test bin/gmm_bench lib/kreg/plugins/kreg_gmm_onednn.so; do
  [ -e "$build/$f" ] || { echo "gpu_bundle: $build/$f not found (a release build with oneDNN and Google Benchmark?)" >&2; exit 1; }
done

# The package for the GPU machine's Python (python-cp312 above): this
# checkout's Python targets in their own tree, configured for GPU_PYTHON and
# the unpacked torch wheel (KREG_TORCH_DIR), with the RUNPATH the bundle
# needs ($ORIGIN/../../lib: its libkreg_registry).
gpu_python=${GPU_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3}
gpu_torch=${GPU_TORCH:-2.11.0}
gpu_package=
if ! gpu_tag=$("$gpu_python" -c 'import os, sys, sysconfig
assert sys.version_info[:2] == (3, 12) and os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")
print("cp312")' 2>/dev/null); then
  [ -z "${GPU_PYTHON:-}" ] || { echo "gpu_bundle: GPU_PYTHON=$GPU_PYTHON is not a CPython 3.12 with its headers" >&2; exit 1; }
  echo "gpu_bundle: no CPython 3.12 with its headers (GPU_PYTHON): the bundle carries no package for the GPU machine's Python"
else
  work=build/gpu-$gpu_tag
  torch_dir=$PWD/$work/torch-$gpu_torch/torch
  wheel=$(ls "$work"/wheels/torch-"$gpu_torch"-"$gpu_tag"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ] && [ ! -e "$torch_dir/version.py" ]; then
    echo "gpu_bundle: downloading torch $gpu_torch for $gpu_tag (once, into $work/wheels)"
    "$gpu_python" -m pip download --quiet --no-deps --only-binary :all: -d "$work/wheels" "torch==$gpu_torch" >&2 ||
      echo "gpu_bundle: warning: no torch $gpu_torch wheel for $gpu_tag (pip download failed)"
    wheel=$(ls "$work"/wheels/torch-"$gpu_torch"-"$gpu_tag"-*.whl 2>/dev/null | head -1 || true)
  fi
  if [ -n "$wheel" ] && [ ! -e "$torch_dir/version.py" ]; then
    unpacked=$(dirname "$torch_dir")
    rm -rf "$unpacked" "$unpacked.partial"
    "$gpu_python" - "$wheel" "$unpacked.partial" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1:]
libs = {"torch/version.py", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so", "torch/lib/libc10.so"}
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("torch/include/") or n in libs])
PY
    mv "$unpacked.partial" "$unpacked"
  fi
  targets=kreg_python
  if [ -e "$torch_dir/version.py" ]; then
    targets="kreg_python kreg_torch"
  else
    torch_dir=
    echo "gpu_bundle: warning: the $gpu_tag package has no _kreg_torch.so: step cuda-arrays skips there"
  fi
  echo "gpu_bundle: building kreg's Python package for $gpu_python ($gpu_tag${torch_dir:+, torch $gpu_torch}) in $work/cmake"
  cmake -S . -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKREG_BUILD_TESTS=OFF -DKREG_BUILD_BENCH=OFF \
    -DPython3_EXECUTABLE="$gpu_python" -DKREG_FRAMEWORK_PYTHON="$gpu_python" -DKREG_TORCH_DIR="$torch_dir" \
    -DCMAKE_INSTALL_LIBDIR=lib -DKREG_PYTHON_INSTALL_DIR="python-$gpu_tag" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON > /dev/null
  # shellcheck disable=SC2086
  cmake --build "$work/cmake" -j "${JOBS:-$(nproc)}" --target $targets
  gpu_package=$work/cmake/python
  # It runs on BUILD's libkreg_registry and plugins, so BUILD should be
  # built from these sources: the same exported names, the same Python files.
  stale=
  cmp -s <(nm -D --defined-only "$build/lib/libkreg_registry.so" | awk '{print $3}' | sort) \
         <(nm -D --defined-only "$work/cmake/lib/libkreg_registry.so" | awk '{print $3}' | sort) || stale=1
  for f in "$gpu_package"/kreg/*.py; do
    [ ! -e "$build/python/kreg/${f##*/}" ] || cmp -s "$f" "$build/python/kreg/${f##*/}" || stale=1
  done
  [ -z "$stale" ] || echo "gpu_bundle: warning: $build is not built from this checkout's sources" \
    "(libkreg_registry's names or the Python files differ): the $gpu_tag package may not work with it"
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/kreg/plugins" "$out/lib/kreg/backends" "$out/deps"
cp "$build"/bin/{kreg,device_test,conformance_test,gmm_bench} "$out/bin/"
mkdir -p "$out/test_plugins"
cp -r "$build"/test_plugins/{axpy,rowsum} "$out/test_plugins/"
cp -P "$build"/lib/libkreg_registry.so* "$out/lib/"
cp -r "$build/libexec" "$build/share" "$out/"
cp "$build"/lib/kreg/plugins/*.so "$out/lib/kreg/plugins/"
cp "$build"/lib/kreg/backends/kreg_cuda_backend.so "$out/lib/kreg/backends/" 2>/dev/null || true
# The Python packages (step cuda-arrays): the folders Python imports, not
# the build's objects; not torch's own libraries.
[ -d "$build/python/kreg" ] && mkdir -p "$out/python" && cp -r "$build/python/kreg" "$out/python/"
if [ -n "$gpu_package" ]; then
  mkdir -p "$out/python-$gpu_tag/kreg"
  cp "$gpu_package"/kreg/*.py "$gpu_package"/kreg/*.so "$out/python-$gpu_tag/kreg/"
  [ -e "$build/python/kreg/libkreg_xla.so" ] && cp "$build/python/kreg/libkreg_xla.so" "$out/python-$gpu_tag/kreg/"
fi
find "$out" -name __pycache__ -prune -exec rm -rf {} +
[ -e "$out/lib/kreg/backends/kreg_cuda_backend.so" ] ||
  echo "gpu_bundle: warning: $build has no kreg_cuda_backend.so (built without the CUDA toolkit): no GPU checks there"
ours=$(find "$out" -type f \( -name '*.so*' -o -perm -u+x \) ! -path "$out/share/*")
# Every library they link but the C runtime's own, which the other machine has.
for f in $ours; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' | grep -v libkreg_registry |
  grep -v /site-packages/ | while read -r lib; do cp -L "$lib" "$out/deps/"; done
for f in $ours; do
  file -b "$f" | grep -q '^ELF' && strip --strip-unneeded "$f"
done
tar -C "$out" -czf "$out/deps.tar.gz" deps && rm -rf "$out/deps"
kib=$(du -sk "$out" | cut -f1)
du -sh "$out"/{bin,lib,deps.tar.gz,libexec,share,test_plugins} "$out"/python*
echo "gpu_bundle: $out is $((kib / 1024)) MiB (limit ${limit_mib} MiB; the carry may be 64 MiB in all)"
if [ "$kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu_bundle: over ${limit_mib} MiB: drop something the checks do not need" >&2
  exit 1
fi
