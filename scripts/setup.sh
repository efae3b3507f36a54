#!/usr/bin/env bash
# Installs the Debian packages ddl needs that are missing (quiet when none is), then configures and
# builds ddl in ./build. Idempotent; used by both README commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake make pkgconf          # toolchain
  libcli11-dev libfmt-dev         # CLI parsing, formatting
  libgloo-dev nlohmann-json3-dev  # libddl: Gloo collectives on CPU, the timeline's JSON
  libpmix-dev pkgconf             # libddl: bootstrap under PMIx launchers
  openmpi-bin libopenmpi-dev      # tests and benchmarks: real mpirun, MPI_Allreduce as a peer
  libboost-dev libboost-filesystem-dev  # Boost.Process: ddl runs scontrol, sbatch, qsub...
  doctest-dev                     # unit tests
  python3 python3-torch           # the PyTorch DDP example and the integration tests
  slurm-wlm munge                 # integration tests: one-node Slurm (scripts/local_slurm.sh); its pmix needs libpmix-dev
  lmod                            # integration tests: real `module load` in the generated Perlmutter script
  jupyter-notebook python3-jupyter-server  # integration tests: ddl jupyter starts a real server
  openssh-server openssh-client iproute2 util-linux  # integration tests: hosts of scripts/testbed.sh, ddl run -H over ssh
)

bash scripts/install_packages.sh "${packages[@]}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" -- --no-print-directory >/dev/null || cmake --build build -j 1
echo "setup: built build/cli/ddl"
