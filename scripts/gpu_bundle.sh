#!/usr/bin/env bash
# Packs what the GPU checks run into build/gpu-bundle (a prefix: bin/, lib/,
# libexec/, share/, and deps/ with the Debian libraries they link that a
# machine without kreg's dependencies lacks), to carry to a machine with a
# GPU and run scripts/gpu_check.sh there. Without oneDNN (40 MB the checks
# do not need); with NVIDIA's compute-sanitizer wheel (14 MB, from PyPI,
# when it can be fetched) in tools/. Run after a release build:
#   scripts/gpu_bundle.sh && du -sh build/gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build/release}
out=build/gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/kreg/plugins" "$out/lib/kreg/backends" "$out/deps"
cp "$build/bin/kreg" "$build/bin/device_test" "$build/bin/conformance_test" "$out/bin/"
cp -r "$build/test_plugins" "$out/"
cp -P "$build"/lib/libkreg_registry.so* "$out/lib/"
cp -r "$build/libexec" "$build/share" "$out/"
for p in "$build"/lib/kreg/plugins/*.so; do
  case "$(basename "$p")" in *onednn*) ;; *) cp "$p" "$out/lib/kreg/plugins/" ;; esac
done
cp "$build"/lib/kreg/backends/kreg_cuda_backend.so "$out/lib/kreg/backends/" 2>/dev/null || true
# The Python package (scripts/gpu_arrays.py), where it was built.
[ -d "$build/python/kreg" ] && cp -r "$build/python" "$out/"
# Every library they link but the C runtime's own, which the other machine has.
for f in "$out"/bin/* "$out"/libexec/kreg/* "$out"/lib/kreg/plugins/*.so "$out"/lib/kreg/backends/*.so \
         "$out"/test_plugins/*/*.so $(ls "$out"/python/kreg/*.so 2>/dev/null); do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' | grep -v libkreg_registry |
  grep -v /site-packages/ |
  while read -r lib; do cp -L "$lib" "$out/deps/"; done
# compute-sanitizer for CUDA 13, which this toolkit lacks; unpacked on the
# other machine.
mkdir -p "$out/tools"
if pip download --quiet --no-deps -d "$out/tools" "nvidia-cuda-sanitizer-api==13.0.85" 2>/dev/null; then
  mv "$out"/tools/nvidia_cuda_sanitizer_api-*.whl "$out/tools/compute-sanitizer.whl"
else
  echo "gpu_bundle: compute-sanitizer could not be fetched; gpu_check.sh will look for one there"
fi
du -sh "$out"
