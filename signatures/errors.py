"""Named errors of the signature engine (STYLE: named exceptions, never a bare assert on input)."""

from __future__ import annotations


class SignatureError(Exception):
    """Base class of every error the signature engine raises on bad input."""


class InvalidRun(SignatureError):
    """A run's metrics could not be read (bad step, bad value, unreadable file)."""


class InvalidLibrary(SignatureError):
    """A fingerprint library does not follow the documented format (docs/fingerprints.md).

    ``path`` names the bad field the way a JSON pointer would, e.g.
    ``fingerprints[3].metrics.grad_norm.direction``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


class UnknownFaultClass(SignatureError, KeyError):
    """A fault class name that the library (or the catalogue) does not know."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown fault class"
