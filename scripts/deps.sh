#!/usr/bin/env bash
# Installs the Debian 12 packages kreg builds with, if any are missing.
# Sourced by demo.sh and test.sh; safe to run again.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libabsl-dev libtbb-dev libdlpack-dev
      libgtest-dev libgmock-dev libbenchmark-dev libfaiss-dev
      libprotobuf-dev protobuf-compiler libcli11-dev nlohmann-json3-dev
      libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin python3 util-linux
      python3-dev python3-venv pybind11-dev python3-numpy python3-pytest python3-matplotlib python3-hypothesis
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "kreg: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
