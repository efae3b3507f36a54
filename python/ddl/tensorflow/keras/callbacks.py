"""Horovod's Keras callbacks over libddl: broadcast the initial state, average metrics, scale and warm
up the learning rate. For Keras 2 and Keras 3 alike."""

import tensorflow as tf

from ddl.common import basics as _basics
from ddl.tensorflow import mpi_ops as _ops
from ddl.tensorflow import _is_variable, _ref
from ddl.tensorflow.functions import broadcast_variables


def _optimizer_variables(optimizer):
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Makes every rank's model and optimizer state root_rank's at the end of the first batch (when
    the optimizer's own variables exist), so that all ranks train the same replica from then on."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars = set()
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        elif not all(_is_variable(v) for v in local_variables):
            raise ValueError("local_variables must be a variable or a collection of variables (tf.Variable, "
                             "or keras.Variable with Keras 3)")
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var):
        """Horovod's: `var` is worker-local and keeps this rank's value (it is not broadcast)."""
        self._local_vars.add(_ref(var))

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables([v for v in self.model.variables if _ref(v) not in self._local_vars], self.root_rank)
        if getattr(self.model, "optimizer", None) is not None:
            broadcast_variables(_optimizer_variables(self.model.optimizer), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """At the end of each epoch, replaces every metric in the logs by its average over all ranks (put
    it before callbacks that read metrics, such as ReduceLROnPlateau or a checkpoint)."""

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if _is_number(v))
        if not names:
            return
        values = [tf.constant(float(logs[k]), tf.float64) for k in names]
        averaged = _ops.grouped_allreduce(values, op=_ops.Average, name=f"MetricAverageCallback.{epoch}")
        for k, v in zip(names, averaged):
            logs[k] = float(v.numpy())


def _is_number(value):
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _get_lr(optimizer):
    lr = optimizer.learning_rate
    return float(lr.numpy() if hasattr(lr, "numpy") else tf.keras.backend.get_value(lr))


def _learning_rate_schedule(optimizer):
    """The optimizer's LearningRateSchedule, or None where its learning rate is a number or variable."""
    schedule_type = tf.keras.optimizers.schedules.LearningRateSchedule
    for where in ("_learning_rate", "learning_rate"):  # Keras 3 keeps the schedule in _learning_rate
        value = getattr(optimizer, where, None)
        if isinstance(value, schedule_type):
            return value
    if hasattr(optimizer, "_get_hyper"):  # Keras 2's optimizers keep it among their hyper-parameters
        try:
            value = optimizer._get_hyper("learning_rate")
        except (KeyError, AttributeError):
            return None
        if isinstance(value, schedule_type):
            return value
    return None


def _set_variable(optimizer, attribute, value):
    """Sets a hyper-parameter the optimizer reads each step; False where it is a plain number that a
    traced step has already baked in (then it is not changed)."""
    current = getattr(optimizer, attribute)
    if hasattr(current, "assign"):
        current.assign(value)
        return True
    if hasattr(optimizer, "_set_hyper"):  # Keras 2 legacy optimizers
        setattr(optimizer, attribute, value)
        return True
    return False


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """Sets the learning rate to initial_lr * multiplier(epoch) from start_epoch up to end_epoch
    (multiplier a function of the epoch, or a number m, which is m ** (epoch - start_epoch) as in
    Horovod's code since 0.23: a decay by m each epoch): at each epoch's start with staircase, else at
    every batch with a fractional epoch. momentum_correction scales a momentum variable by the ratio of
    the new to the old learning rate for the batch where the rate changes."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))

    def _autodetect_steps_per_epoch(self):
        params = self.params or {}
        if params.get("steps"):
            return params["steps"]
        if params.get("samples") and params.get("batch_size"):
            return -(-params["samples"] // params["batch_size"])
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                         "steps_per_epoch parameter to the LearningRateScheduleCallback() or upgrade to the "
                         "latest version of Keras.")

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_variable(optimizer, "learning_rate", new_lr)
        if self.momentum_correction and old_lr > 0 and hasattr(optimizer, "momentum"):
            momentum = optimizer.momentum
            value = float(momentum.numpy() if hasattr(momentum, "numpy") else momentum)
            if _set_variable(optimizer, "momentum", value * new_lr / old_lr):
                self.restore_momentum = value

    def _restore_momentum_if_needed(self):
        if self.restore_momentum is not None:
            _set_variable(self.model.optimizer, "momentum", self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            raise ValueError("initial_lr must be given to the learning rate callbacks")
        schedule = _learning_rate_schedule(self.model.optimizer)
        if schedule is not None:
            # Keras 3 would keep the schedule and ignore what is set; Keras 2 would replace it by a
            # constant for good: either silently. Horovod's callbacks cannot set a schedule either.
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, which is a schedule here "
                             f"({type(schedule).__name__}): give the optimizer a number as its "
                             "learning rate, or build the warmup into the schedule and drop this callback")
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust_learning_rate(epoch)

    def on_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from initial_lr / size to initial_lr over warmup_epochs (every batch),
    as in Goyal et al.; with verbose, rank 0 says when the warmup ends."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Adjust epoch to produce a round number at the end of each epoch, so that TensorBoard
            # learning rate graphs look better.
            epoch += 1.0 / self.steps_per_epoch
            size = _basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and _basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {_get_lr(self.model.optimizer):g}.")


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """A ModelCheckpoint that keeps only the best model and writes it on rank 0 alone. Its arguments are
    Horovod's, in Horovod's order, and `filepath` (Horovod sets it afterwards) by keyword: by default
    best_model.keras, or best_model.weights.h5 with save_weights_only. A path given first (this
    class's earlier signature) is still taken as filepath."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto", save_freq="epoch", *,
                 filepath=None):
        if filepath is None and isinstance(monitor, str) and monitor.endswith((".keras", ".h5")):
            filepath, monitor = monitor, "val_loss"
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, *args, **kwargs):
        if _basics.rank() == 0:
            return super()._save_model(*args, **kwargs)
        return None
