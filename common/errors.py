"""The error types the CLI turns into one line and exit code 2."""


class MlhpcError(Exception):
    """An error with a message that names the thing at fault and the fix."""


class ConfigError(MlhpcError):
    """A config file or override is wrong."""


class DataError(MlhpcError):
    """A dataset file is missing, truncated or malformed."""


class StagingError(MlhpcError):
    """Staging could not copy or verify a file."""


class SubmissionError(MlhpcError):
    """A submission directory cannot be read or written."""


class TrainingError(MlhpcError):
    """Training stopped abnormally (non-finite loss, no target by max epochs)."""
