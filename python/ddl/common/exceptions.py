"""Horovod's exception kinds, and which one a libddl status raises."""

from ddl import _lib as L


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank because a peer failed, timed out or the world broke."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic signal; ddl runs fixed worlds and never raises it."""


# As horovod.common: bad arguments and use before init are ValueErrors, a mismatch across ranks a
# RuntimeError, a broken world HorovodInternalError. A face with its own error types (TensorFlow's
# tf.errors) converts them by the `ddl_status` each raised exception carries.
L.register_raisers({
    L.INVALID_ARGUMENT: ValueError,
    L.NOT_INITIALIZED: ValueError,
    L.MISMATCH: RuntimeError,
    L.TIMEOUT: HorovodInternalError,
    L.PEER_FAILED: HorovodInternalError,
    L.BOOTSTRAP: HorovodInternalError,
    L.INTERNAL: HorovodInternalError,
})
