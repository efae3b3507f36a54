"""What the two TensorFlow examples share: a synthetic MNIST stand-in (no download) and the check
that every rank ends with the same weights."""

import hashlib

import numpy as np


def synthetic_mnist(samples, seed):
    """28x28x1 images whose label (0-9) decides where a bright 6x6 blob sits, plus noise."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=samples)
    images = rng.rand(samples, 28, 28, 1).astype("float32") * 0.3
    for i, label in enumerate(labels):
        row, col = 2 + 8 * (label // 4), 2 + 8 * (label % 4)
        images[i, row:row + 6, col:col + 6, 0] += 0.7
    return images, labels.astype("int64")


def replicas_identical(hvd, variables):
    """(every rank holds the same weights, rank 0's sha256 of them)."""
    sha = hashlib.sha256()
    for v in sorted(variables, key=lambda v: v.name):
        sha.update(v.name.encode())
        sha.update(np.ascontiguousarray(v.numpy()).tobytes())
    digests = hvd.allgather_object(sha.hexdigest())
    return all(d == digests[0] for d in digests), digests[0]
