#!/usr/bin/env bash
# `pip install .` checked from a clean install: a scratch venv of Debian's
# Python 3 that sees build/venv's packages (NumPy 2, PyTorch, JAX,
# scikit-build-core; scripts/venv.sh makes it) through a .pth file, so
# nothing is downloaded; kreg built into it from this tree
# (--no-build-isolation: the build sees the venv's torch and jax and builds
# the shims); then, from another folder, the installed package and the
# `kreg` command used as a user would, and the tree left as it was.
#
#   scripts/check_pip.sh [--clean]
#
# The wheel's build folder, build/pip/<wheel tag> (pyproject.toml), is
# kept between runs, so a second run rebuilds only what changed;
# --clean removes it first (the first run, as on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
if [ "${1:-}" = --clean ]; then rm -rf build/pip; fi
frameworks=$(build/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
version=$(sed -n 's/^project(kreg VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tmp=$(mktemp -d /tmp/kreg-pip.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git_before=$(git status --porcelain --ignored=no)
touch "$tmp/stamp"

/usr/bin/python3 -m venv "$tmp/venv"
echo "$frameworks" > "$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/frameworks.pth"
start=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$tmp/venv/bin/python" -m pip install --quiet --no-build-isolation "$src"
echo "kreg: pip install . took $((SECONDS - start)) s" >&2

# pip wrote nothing into the tree but build/pip, and nothing at all into
# build/release.
[ "$(git status --porcelain --ignored=no)" = "$git_before" ] || { git status --short; exit 1; }
if [ -d build/release ] && [ -n "$(find build/release -newer "$tmp/stamp" -print -quit)" ]; then
  echo "kreg: pip install . wrote into build/release" >&2; exit 1
fi

# From elsewhere, with build/ out of sight: the venv's kreg alone.
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
export PATH="$tmp/venv/bin:$PATH"
unset PYTHONPATH KREG_PLUGIN_PATH KREG_TABLE_PATH KREG_WORKER
[ "$(command -v kreg)" = "$tmp/venv/bin/kreg" ]
kreg --help > "$tmp/help"
grep -q "^ *list " "$tmp/help"
kreg list > "$tmp/list"
grep -q "topk/sort" "$tmp/list"
[ "$(kreg --version)" = "kreg $version" ]
python -m kreg > "$tmp/kernels"
head -3 "$tmp/kernels"
grep -q "^  topk/radix" "$tmp/kernels"
python - "$version" "$tmp" <<'PY'
import importlib.metadata, importlib.util, os, sys, sysconfig
import numpy as np
import kreg

version, tmp = sys.argv[1:]
prefix = kreg.install_prefix()
assert prefix == os.path.realpath(os.path.join(sysconfig.get_paths()["platlib"], "kreg")), prefix
assert kreg.__version__ == version == importlib.metadata.version("kreg"), kreg.__version__
registry = kreg.Registry()
assert registry.files and all(f.startswith(prefix + "/lib/kreg/plugins/") for f in registry.files), registry.files
for path in ("bin/kreg", "libexec/kreg/kreg-worker", "share/kreg/tables/amd-epyc-avx2-2c.txtpb"):
    assert os.path.exists(os.path.join(prefix, path)), path

x = np.random.default_rng(0).standard_normal((4, 300), dtype=np.float32)
want = np.argsort(-x, axis=1, kind="stable")[:, :7]
assert (kreg.run("topk/radix", input=x, k=7)["indices"] == want).all()
assert (kreg.Dispatcher().run("topk", input=x, k=7)["indices"] == want).all()
lhs = np.ones((6, 4), np.float32)
rhs = np.stack([np.eye(4, 3, dtype=np.float32), 2 * np.eye(4, 3, dtype=np.float32)])
out = kreg.Dispatcher().run("gmm", lhs=lhs, rhs=rhs, group_sizes=np.array([2, 3], np.int32))["out"]
assert (out == np.concatenate([np.ones((2, 3)), 2 * np.ones((3, 3)), np.zeros((1, 3))])).all(), out

# The tuner, through the packaged kreg-worker.
table = os.path.join(tmp, "topk.lut")
result = kreg.tune("topk", {"batch": 2, "n": 256, "k": 4}, table, variants=["sort", "radix"],
                   strategy="exhaustive", reps=2, warmup=1, thread_round=False)
assert result["best"] and result["counts"]["failed"] == 0, result
assert len(kreg.TuningDb(table)) == 1

if importlib.util.find_spec("torch"):
    import torch, kreg.torch
    values, indices = torch.ops.kreg.topk(torch.from_numpy(x), 7)
    assert (indices.numpy() == want).all()
    print("kreg.torch:", os.path.basename(kreg.torch._SHIM))
if importlib.util.find_spec("jax"):
    import jax.numpy as jnp, kreg.jax
    values, indices = kreg.jax.topk(jnp.asarray(x), 7)
    assert (np.asarray(indices) == want).all()
    print("kreg.jax:", os.path.basename(kreg.jax._LIBRARY))
print(f"kreg {kreg.__version__} installed by pip at {prefix}: runs, dispatches, tunes")
PY
