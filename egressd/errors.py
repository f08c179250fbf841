"""The project's base error types: the ones every layer may raise or catch."""


class EgressdError(Exception):
    """Base of every error egressd raises on purpose."""


class ConfigError(EgressdError):
    """A flag, environment variable or configuration file is wrong.

    Raised at start-up, before any task runs; the message names what was wrong
    (a flag, a file path, or a path inside a file) and is shown to the user as
    one line, never as a traceback.
    """
