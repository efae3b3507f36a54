#!/usr/bin/env bash
# Installs the Debian packages ddl needs that are missing (quiet when none is), then configures and
# builds ddl in ./build. Idempotent; used by both README commands and by CI.
#
#   bash scripts/setup.sh              # what ddl and the main job need (README command 1)
#   bash scripts/setup.sh --for-tests  # and what the tests need besides: Slurm, OpenMPI, Jupyter, sshd... (command 2)
set -euo pipefail
cd "$(dirname "$0")/.."

for_tests=0
case "${1:-}" in
  "") ;;
  --for-tests) for_tests=1 ;;
  *) echo "setup: unknown argument '$1' (usage: $0 [--for-tests])" >&2; exit 2 ;;
esac

packages=(
  g++ cmake make pkgconf          # toolchain
  libcli11-dev libfmt-dev         # CLI parsing, formatting
  libgloo-dev nlohmann-json3-dev  # libddl: Gloo collectives on CPU, the timeline's JSON
  libpmix-dev                     # libddl: bootstrap under PMIx launchers
  libboost-dev libboost-filesystem-dev  # Boost.Process: ddl runs scontrol, sbatch, qsub...
  python3 python3-torch python3-venv    # the PyTorch examples; the TensorFlow venvs (scripts/tf_venv.sh)
  python3-dev                     # the Python package's compiled per-op calls (python/ddl/_fastpath.c)
)
test_packages=(
  doctest-dev                     # unit tests
  openmpi-bin libopenmpi-dev      # tests and benchmarks: real mpirun, MPI_Allreduce as a peer
  slurm-wlm munge                 # integration tests: one-node Slurm (scripts/local_slurm.sh); its pmix needs libpmix-dev
  lmod                            # integration tests: real `module load` (the Perlmutter script, ddl's own module file)
  jupyter-notebook python3-jupyter-server  # integration tests: ddl jupyter starts a real server
  openssh-server openssh-client iproute2 util-linux  # integration tests: hosts of scripts/testbed.sh, ddl run -H over ssh
  git                             # the pip-install test copies the checkout's files
  python3-tqdm                    # integration tests: a real tqdm progress bar under ddl run
  python3-cloudpickle             # integration tests: broadcast_object of a lambda (Horovod sends objects with cloudpickle)
  gdb                             # integration tests: the hang watchdog shows a native worker's stack through gdb
)
((for_tests)) && packages+=("${test_packages[@]}")

bash scripts/install_packages.sh "${packages[@]}"

# The main job needs no test programs; the test command builds them into the same tree.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=$((for_tests ? 1 : 0)) >/dev/null
cmake --build build -j "$(nproc)" -- --no-print-directory >/dev/null || cmake --build build -j 1
echo "setup: built build/cli/ddl"
