"""ddl.keras: Horovod's Keras API over libddl (`import ddl.keras as hvd`), the very module
ddl.tensorflow.keras, as horovod.keras is horovod.tensorflow.keras for TensorFlow 2."""

import sys

from ddl.tensorflow import keras as _keras

sys.modules[__name__] = _keras
sys.modules[__name__ + ".callbacks"] = _keras.callbacks
