#!/usr/bin/env bash
# Makes build/venv: Debian's Python 3.11 (so the kreg module built for it
# imports there) with pinned PyTorch and JAX (CPU) for kreg.torch and
# kreg.jax and their tests, and scikit-build-core for `pip install .`.
# Debian's own pip is externally managed and its NumPy (1.24) too old for
# current JAX. About 6 GB (PyTorch brings its CUDA libraries); a few
# minutes the first time, nothing once the pins are installed. CMake finds
# it as KREG_FRAMEWORK_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv
pins=(torch==2.15.0 jax==0.10.2 jaxlib==0.10.2 numpy==2.4.6 pytest==9.2.0 scikit-build-core==0.12.2)
stamp="$venv/.kreg-pins"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${pins[*]}" ]; then
  exit 0
fi
echo "kreg: making $venv (${pins[*]})" >&2
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
echo "${pins[*]}" > "$stamp"
