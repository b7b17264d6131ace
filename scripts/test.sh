#!/usr/bin/env bash
# Builds kreg and passes its tests on a fresh Debian 12 machine: installs
# what is missing, configures, builds and runs every CTest suite, runs each
# fuzzer for a minute under ASan and UBSan (the asan preset, clang), then
# installs kreg into a scratch prefix, moves it, and builds and runs the
# find_package(kreg) examples against it: a program, and a plugin; and
# checks `pip install .` (scripts/check_pip.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/venv.sh   # PyTorch and JAX for kreg.torch, kreg.jax and their tests
cmake --workflow --preset release
cmake --workflow --preset fuzz
# The package is relocatable: installed to one prefix and moved to another,
# the program built against it finds the plugins and tables beside the
# library, with no --plugin-path.
prefix=$PWD/build/release/_install
rm -rf "$prefix" "$prefix.staged"
cmake --install build/release --prefix "$prefix.staged" >/dev/null
mv "$prefix.staged" "$prefix"
cmake -S examples -B build/example -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/example
build/example/topk_example --db "$prefix/share/kreg/tables/amd-epyc-avx2-2c.txtpb"
# The installed Python package, from the moved prefix too.
PYTHONPATH=$(echo "$prefix"/lib/python3*/dist-packages) /usr/bin/python3 - "$prefix" <<'PY'
import sys, numpy as np, kreg
assert kreg.install_prefix() == sys.argv[1], kreg.install_prefix()
out = kreg.run("topk/heap", input=np.arange(10, dtype=np.float32).reshape(1, 10), k=3)
assert out["indices"].tolist() == [[9, 8, 7]], out
print("installed kreg Python package:", kreg.Dispatcher().run("topk", input=np.ones((2, 50), np.float32), k=4)["indices"][0])
PY
# A plugin built outside the tree against the installed package (the ABI
# alone), listed and run by the installed kreg.
cmake -S examples/plugin -B build/plugin_example -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/plugin_example
"$prefix/bin/kreg" list --plugin-path build/plugin_example | grep "scale/plain" >/dev/null
"$prefix/bin/kreg" run scale/plain --plugin-path build/plugin_example --dims n=1000,alpha=2 --check
# pip install . into a scratch venv, and the package and command used from
# there (scripts/check_pip.sh; its build folder build/pip is kept).
scripts/check_pip.sh
