"""A custom TensorFlow 2 training loop with `import ddl.tensorflow as hvd`, as Horovod's tutorials
write it: a tf.function step whose tape is wrapped by hvd.DistributedGradientTape (a step's gradients
go to libddl as one group), hvd.broadcast_variables from rank 0 after the first step, the loss
averaged over ranks with hvd.allreduce. On synthetic MNIST-shaped data (no download):

    PYTHONPATH=build/python ddl run -np 4 -- $(bash scripts/tf_venv.sh keras2 --python) examples/tensorflow_horovod.py

Ends with every rank hashing its weights and rank 0 saying whether the replicas are identical
(exit 1 if not).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import ddl.tensorflow as hvd  # noqa: E402
from tensorflow_common import replicas_identical, synthetic_mnist  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--samples", type=int, default=2048)
    return parser.parse_args()


def main():
    args = parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(7 + hvd.rank())

    images, labels = synthetic_mnist(args.samples, seed=42)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shard(hvd.size(), hvd.rank())
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.Adam(args.lr * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        # After the first step (when the optimizer's variables exist), everyone takes rank 0's state.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables if not callable(optimizer.variables)
                                    else optimizer.variables(), root_rank=0)
        return hvd.allreduce(loss)

    for step, (x, y) in enumerate(dataset.take(args.steps)):
        loss = training_step(x, y, step == 0)
        if hvd.rank() == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps} loss {float(loss):.4f}", flush=True)

    same, digest = replicas_identical(hvd, model.variables)
    if hvd.rank() == 0:
        print(f"replicas identical: {'yes' if same else 'NO'} (sha256 {digest[:16]})", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
