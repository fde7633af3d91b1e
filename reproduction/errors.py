"""Named errors of the reproduction stage (fault injection, engine configuration, backends, devices)."""

from __future__ import annotations


class ReproductionError(Exception):
    """Base class: anything the reproduction stage refuses with a message the user can act on."""


class UnknownFault(ReproductionError, KeyError):
    """A fault class or variant name that the injector registry does not hold."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class InvalidFaultParams(ReproductionError, ValueError):
    """Parameters a fault injector cannot take (unknown name, wrong type, out of range)."""


class InvalidEngineConfig(ReproductionError, ValueError):
    """An engine configuration that cannot work (batch sizes that do not divide, a bad estimator)."""


class UnknownBackend(ReproductionError, KeyError):
    """A backend name that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DeviceUnavailable(ReproductionError, RuntimeError):
    """The requested device (or dtype on it) is not usable in this process."""


class ModelLoadError(ReproductionError, ValueError):
    """A model directory that cannot be loaded as a causal MoE LM with a tokenizer."""


class InvalidManifest(ReproductionError, ValueError):
    """A manifest file that cannot be read back into a run request."""


class UnknownView(ReproductionError, KeyError):
    """A framework view (metric naming) that :mod:`moeproxy.reproduction.views` does not register."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownFormat(ReproductionError, KeyError):
    """A response format that :mod:`moeproxy.reproduction.formats` does not register."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
