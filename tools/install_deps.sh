#!/usr/bin/env bash
# Installs what MPI Learn needs on Debian 12, all from Debian's packages.
# Safe to run again: it installs only what is missing. Needs root (or sudo).
#
#   tools/install_deps.sh          everything: build, run, test (tools/test.sh)
#   tools/install_deps.sh --run    only what building and running the master,
#                                  the worker and mpilearnctl on the default
#                                  job needs (tools/quickstart.sh)
set -euo pipefail

# Building and running mpilearn-master, mpilearn-worker and mpilearnctl (the
# headers their objects include come from these packages and theirs) and the
# built-in default job's data.
RUN_PACKAGES=(
  bazel-bootstrap            # Bazel 4.2.3 (offline builds, see WORKSPACE)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin
  libtorch-dev libopenblas0-pthread   # OpenBLAS: ~2.5x faster than reference BLAS
  libabsl-dev libgoogle-glog-dev libgflags-dev
  prometheus-cpp-dev
  zlib1g-dev
  openssl libssl-dev          # TLS: the master checks its key (OpenSSL); tests make certificates
  libhdf5-dev                # users' data files: .h5 (worker/data/hdf5_file.cc, tools/data/convert_data)
  dataset-fashion-mnist      # the built-in default job's data
)

# The tests, the checks and the other tools.
TEST_PACKAGES=(
  clang-14                   # checked locking: tools/check_thread_safety.sh
  libclang-rt-14-dev lld     # fuzzing: libFuzzer, ASan, UBSan (tools/fuzz.sh)
  prometheus                 # a real Prometheus server for the metrics test
  libgtest-dev googletest
  python3-h5py               # to write and inspect .h5 data files from Python
  python3-torch              # tools/cli/export_torchscript.py: users' models (PyTorch 1.13)
  libyaml-cpp-dev            # mpilearn-opt reads study specs written in YAML
  python3-grpcio python3-protobuf  # the Python client (tools/python)
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install ./tools/python
  python3-matplotlib         # the Python client's study plots
  python3-optuna             # MPI Opt's references: TPE/ASHA tests, bench_opt
  python3-yaml               # deploy/kubernetes/check_manifests.py
  iproute2                   # the cross-host tests' hosts: ip netns, veth, tc
  slurm-wlm munge            # a real Slurm for tests/slurm_test (deploy/*.sbatch)
  shellcheck                 # deploy_files_test lints the batch scripts
)

case "${1:-}" in
  --run) PACKAGES=("${RUN_PACKAGES[@]}") ;;
  "") PACKAGES=("${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  *) echo "usage: tools/install_deps.sh [--run]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
