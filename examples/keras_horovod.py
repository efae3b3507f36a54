"""The ALCF/NERSC Horovod Keras tutorial's CNN on `import ddl.tensorflow.keras as hvd`.

The tutorial's script runs unchanged but for its import line: model.fit with hvd.DistributedOptimizer,
the learning rate scaled by hvd.size(), BroadcastGlobalVariablesCallback(0), MetricAverageCallback(),
LearningRateWarmupCallback(...), checkpoints on rank 0 only. On synthetic MNIST-shaped data (no
download). Keras 2 (TensorFlow 2.15) and Keras 3 (TensorFlow 2.16+) alike:

    PYTHONPATH=build/python ddl run -np 4 -- $(bash scripts/tf_venv.sh keras3 --python) examples/keras_horovod.py

Ends with every rank hashing its weights and rank 0 saying whether the replicas are identical
(exit 1 if not).
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import ddl.tensorflow.keras as hvd  # noqa: E402
from tensorflow_common import replicas_identical, synthetic_mnist  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--checkpoint-dir", default=None, help="rank 0 writes a checkpoint here each epoch")
    return parser.parse_args()


def main():
    args = parse_args()
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per process, by local rank (ddl run already narrows CUDA_VISIBLE_DEVICES)
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank() % len(gpus)], True)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(1234 + hvd.rank())  # different initial weights per rank: the broadcast aligns them

    images, labels = synthetic_mnist(args.samples, seed=42)
    shard = slice(hvd.rank(), None, hvd.size())  # each rank its own part of the data
    dataset = tf.data.Dataset.from_tensor_slices((images[shard], labels[shard])).shuffle(1000, seed=hvd.rank())
    dataset = dataset.batch(args.batch_size)

    model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = args.lr * hvd.size()  # the workers' batches add up to one large batch
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs,
                                                 verbose=1),
    ]
    if hvd.rank() == 0 and args.checkpoint_dir:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    if hvd.rank() == 0:
        print(f"epoch {args.epochs}/{args.epochs} loss {history.history['loss'][-1]:.4f} "
              f"accuracy {100 * history.history['accuracy'][-1]:.1f}%", flush=True)

    # A model saved with the wrapped optimizer reloads wrapped (hvd.load_model), as Horovod's.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"model-{hvd.rank()}.keras")
        model.save(path)
        reloaded = hvd.load_model(path)
        assert getattr(reloaded.optimizer, "_ddl_distributed", False), "the reloaded optimizer is not distributed"

    same, digest = replicas_identical(hvd, model.variables)
    if hvd.rank() == 0:
        print(f"replicas identical: {'yes' if same else 'NO'} (sha256 {digest[:16]})", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
