"""Exceptions that the CLI turns into one-line messages and a non-zero exit."""


class HvdtrainError(Exception):
    """Base class: anything the user can fix (bad input, bad configuration)."""

    exit_code = 1


class ConfigError(HvdtrainError):
    """An option value or a combination of options is invalid."""

    exit_code = 2


class ArgumentError(ConfigError, ValueError):
    """An argument of the Keras layer (`hvdtrain.keras`) is invalid, or two clash.

    A ValueError to code that calls the layer from its own `model.fit`, as Keras's own
    argument checks are; a ConfigError to the CLI, so a combination that configuration
    validation let through still ends in one line. A ValueError from deeper down (e.g.
    TensorFlow during training) is not one of these and keeps its traceback.
    """


class DataError(HvdtrainError):
    """A data file or directory is missing, unreadable or malformed."""

    exit_code = 3


class RunFolderError(HvdtrainError):
    """The run folder (--out) cannot be made or written: no such parent, no permission,
    a full disk."""


class TrainingDiverged(HvdtrainError):
    """The loss or the weights stopped being finite, or the divergence guard saw the loss
    blow up. Here, not beside the callbacks that raise it, so that a sweep driver can tell
    its exit code from a failure's without importing TensorFlow."""

    exit_code = 4


class PeerLostError(HvdtrainError):
    """A collective failed because another worker died or left (a job without --elastic)."""

    exit_code = 6
