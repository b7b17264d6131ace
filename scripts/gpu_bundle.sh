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
#   deps/     every library they link but the C runtime's own, which that
#             machine has: Abseil, protobuf, oneTBB, OpenMP, Google
#             Benchmark, oneDNN (libdnnl, ~40 MB of the bundle)
# Copies of our own files are stripped (--strip-unneeded); the Debian
# libraries already are. Prints the size and fails past 60 MiB.
# Run after a release build (BUILD names another build tree):
#   scripts/gpu_bundle.sh
#   BUILD=/path/to/build/release scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build/release}
out=build/gpu-bundle
limit_mib=60
for f in bin/kreg bin/device_test bin/conformance_test bin/gmm_bench lib/kreg/plugins/kreg_gmm_onednn.so; do
  [ -e "$build/$f" ] || { echo "gpu_bundle: $build/$f not found (a release build with oneDNN and Google Benchmark?)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/kreg/plugins" "$out/lib/kreg/backends" "$out/deps"
cp "$build"/bin/{kreg,device_test,conformance_test,gmm_bench} "$out/bin/"
mkdir -p "$out/test_plugins"
cp -r "$build"/test_plugins/{axpy,rowsum} "$out/test_plugins/"
cp -P "$build"/lib/libkreg_registry.so* "$out/lib/"
cp -r "$build/libexec" "$build/share" "$out/"
cp "$build"/lib/kreg/plugins/*.so "$out/lib/kreg/plugins/"
cp "$build"/lib/kreg/backends/kreg_cuda_backend.so "$out/lib/kreg/backends/" 2>/dev/null || true
# The Python package (step cuda-arrays): the folder Python imports, not the
# build's objects; not the build's own torch libraries.
[ -d "$build/python/kreg" ] && mkdir -p "$out/python" && cp -r "$build/python/kreg" "$out/python/"
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
kib=$(du -sk "$out" | cut -f1)
du -sh "$out"/{bin,lib,deps,libexec,share,test_plugins} "$out"/python*
echo "gpu_bundle: $out is $((kib / 1024)) MiB (limit ${limit_mib} MiB; the carry may be 64 MiB in all)"
if [ "$kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu_bundle: over ${limit_mib} MiB: drop something the checks do not need" >&2
  exit 1
fi
