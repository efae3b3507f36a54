#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job — real data-parallel
# training with 4 workers on this machine, started and supervised by `ddl run`: PyTorch DDP
# (gloo), the ALCF tutorial's Horovod script on ddl.torch (libddl from Python), the Horovod Keras
# tutorial's CNN on ddl.keras (Keras 3) and a custom TensorFlow loop on ddl.tensorflow (Keras 2), each
# with 2 workers (TensorFlow from PyPI in cached venvs: scripts/tf_venv.sh), then a C++ MLP whose
# gradients libddl averages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== PyTorch DDP, 4 workers: ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py"
build/cli/ddl run -np 4 -- /usr/bin/python3 examples/pytorch_ddp.py
echo "== Horovod-style PyTorch on ddl.torch, 4 workers: ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" build/cli/ddl run -np 4 -- /usr/bin/python3 examples/pytorch_horovod.py
keras3_python=$(bash scripts/tf_venv.sh keras3 --python)
keras2_python=$(bash scripts/tf_venv.sh keras2 --python)
echo "== Horovod-style Keras (model.fit) on ddl.keras, TensorFlow 2.21 / Keras 3, 2 workers: ddl run -np 2 -- $keras3_python examples/keras_horovod.py"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" build/cli/ddl run -np 2 -- "$keras3_python" examples/keras_horovod.py
echo "== Horovod-style TensorFlow loop on ddl.tensorflow, TensorFlow 2.15 / Keras 2, 2 workers: ddl run -np 2 -- $keras2_python examples/tensorflow_horovod.py"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" build/cli/ddl run -np 2 -- "$keras2_python" examples/tensorflow_horovod.py
echo "== C++ on libddl, 4 workers: ddl run -np 4 -- build/examples/cpp_train"
build/cli/ddl run -np 4 -- build/examples/cpp_train
