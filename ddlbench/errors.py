"""Errors a user can act on. Each maps to a result status or to exit code 2."""


class ConfigError(ValueError):
    """Bad input: printed as one line, exit code 2, before any process starts."""


class UnsupportedError(RuntimeError):
    """This framework/variant cannot run here (missing package, device). Becomes status
    `unsupported` with the reason; never a crash of a sweep."""
