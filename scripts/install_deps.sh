#!/usr/bin/env bash
# Installs what handgrad needs from Debian/Ubuntu packages, only what is missing.
# CUDA is optional and never installed here: with nvcc on PATH (or in
# /usr/local/cuda/bin) the CUDA backend builds too.
set -euo pipefail

# libcairo2-dev + pkg-config: the programs' plots (optional at build time:
# without them everything builds and the programs say no plot can be written).
# libsentencepiece-dev: the subword vocabulary of train --task translate (optional
# at build time: without it `translate` is not built and the task says why).
# openmpi-bin + libopenmpi-dev: data-parallel training (mpirun -np N train; optional at
# build time: without MPI every program runs as one process; docs/distributed.md).
packages=(cmake make g++ pkg-config libeigen3-dev catch2 libspdlog-dev libfmt-dev libcli11-dev libcairo2-dev
          libsentencepiece-dev openmpi-bin libopenmpi-dev
          nlohmann-json3-dev python3 python3-matplotlib)
# The Python module (python/, optional in CMake) and its tests: pybind11, NumPy,
# and PyTorch for the handgrad.torch tests (Debian's 1.13, CPU; measured
# 2026-11-23 on the 2-core box: apt-get install 75 s, ~1 GB with its deps).
# Only the test command needs PyTorch: scripts/test.sh sets HG_WITH_TORCH=1
# (HG_NO_TORCH=1 there leaves it out, and those tests skip with a message);
# the main job (scripts/run.sh) does not install it.
packages+=(python3-dev pybind11-dev python3-numpy)
# clang-format: CTest's `format` test (scripts/format.sh --check; the style is
# checked with Debian 12's clang-format 14).
packages+=(clang-format)
# libtorch-dev: PyTorch's C++ headers, for handgrad._torch_ext (the drop-ins as C++ autograd
# functions; measured 2026-11-26 on the 2-core box: ~4 s, 26 MB plus glog/gflags/protobuf headers).
[[ "${HG_WITH_TORCH:-0}" == 1 && "${HG_NO_TORCH:-0}" != 1 ]] && packages+=(python3-torch libtorch-dev)
[[ "${HG_WITH_FUZZ:-0}" == 1 ]] && packages+=(clang libclang-rt-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
