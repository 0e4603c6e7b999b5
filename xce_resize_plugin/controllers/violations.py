"""Errors of the embedded controller.

They are not :class:`~xce_resize_plugin.errors.ResizeError`: those are the plugin's
answers to users, these are the host's. A :class:`ContractViolation` means the plugin
(or a test plugin) broke the host contract; it is raised at the call that broke it so
that the bug is found where it happens.
"""

from __future__ import annotations


class EmbeddedError(Exception):
    """Base of the embedded controller's errors."""


class SubmissionRejected(EmbeddedError, ValueError):
    """The host refuses a job (bad options, a job that could never start)."""


class UnknownJob(EmbeddedError, KeyError):
    """No job with this id."""

    def __str__(self) -> str:
        # KeyError quotes its argument; a readable message is more useful here.
        return str(self.args[0]) if self.args else "unknown job"


class ContractViolation(EmbeddedError, RuntimeError):
    """A caller broke the host contract: overbooking, a task not reserved, re-entry."""


class InvariantViolation(EmbeddedError, AssertionError):
    """A checked invariant failed (raised only when the controller is ``strict``)."""


class SettleLoopError(EmbeddedError, RuntimeError):
    """An instant did not settle within the cycle cap: something keeps changing."""


class StoreError(EmbeddedError, RuntimeError):
    """The controller's own state could not be read (corrupt, newer schema)."""


class UnknownHost(EmbeddedError, KeyError):
    """No host with this name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown host"


class HostStateError(EmbeddedError, ValueError):
    """A host state change that does not apply to the host's state (``up`` of a host
    that is not down, ``open`` of a host that is not closed, ...)."""
