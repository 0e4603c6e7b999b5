"""One error hierarchy with stable codes.

Where LSF has a code for a condition we use its name, number and message, so scripts
written for ``bresize`` keep working (docs/user-guide.md, "Error codes and messages"). Library code
raises these; only the command lines and the REST layer turn them into messages,
exit codes and HTTP statuses.
"""

from __future__ import annotations


class ResizeError(Exception):
    """Base of every error the plugin raises on purpose.

    ``code`` is stable (``LSBE_*`` where LSF has one, else ``XCE_RESIZE_*``),
    ``lsf_number`` is LSF's numeric code or ``None``, ``http_status`` what the REST API
    answers. ``detail`` adds our own explanation after LSF's message.
    """

    code = "XCE_RESIZE_ERROR"
    lsf_number: int | None = None
    message = "Resize request failed"
    http_status = 400

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail
        super().__init__(self.text)

    @property
    def text(self) -> str:
        return f"{self.message}: {self.detail}" if self.detail else self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled (an error raised in a sweep's worker process) as the exception it
        # is: the default calls the class with its text, which a class whose
        # __init__ adds to its argument (this one adds ``message``) would add again.
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(
    cls: type[ResizeError], args: tuple[object, ...], state: dict[str, object]
) -> ResizeError:
    """An unpickled :class:`ResizeError`: its arguments and attributes, no __init__."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


# The LSF conditions, one class each, in the order of the reference table.


class NotifyCmdTooLong(ResizeError):
    """LSF LSBE_RESIZE_NOTIFY_CMD_LEN (356)."""

    code = "LSBE_RESIZE_NOTIFY_CMD_LEN"
    lsf_number = 356
    message = "Job notify command must be less than 4096"


class JobNotResizable(ResizeError):
    """LSF LSBE_JOB_RESIZABLE (357)."""

    code = "LSBE_JOB_RESIZABLE"
    lsf_number = 357
    message = "Job is not resizable"
    http_status = 409


class BadReleaseHostSpec(ResizeError):
    """LSF LSBE_RESIZE_RELEASE_HOSTSPEC (358)."""

    code = "LSBE_RESIZE_RELEASE_HOSTSPEC"
    lsf_number = 358
    message = "Incorrect host specified for release"


class ResizeInProgress(ResizeError):
    """LSF LSBE_RESIZE_EVENT_INPROGRESS (361)."""

    code = "LSBE_RESIZE_EVENT_INPROGRESS"
    lsf_number = 361
    message = "Request rejected. There is a resize request in progress"
    http_status = 409


class NoActiveRequest(ResizeError):
    """LSF LSBE_RESIZE_NO_ACTIVE_REQUEST (363)."""

    code = "LSBE_RESIZE_NO_ACTIVE_REQUEST"
    lsf_number = 363
    message = "No pending resize request"
    http_status = 409


class HostNotInAlloc(ResizeError):
    """LSF LSBE_HOST_NOT_IN_ALLOC (364)."""

    code = "LSBE_HOST_NOT_IN_ALLOC"
    lsf_number = 364
    message = "Specified hosts not part of the job's allocation"


class BadHost(ResizeError):
    """LSF LSBE_RESIZE_BAD_HOST (372)."""

    code = "LSBE_RESIZE_BAD_HOST"
    lsf_number = 372
    message = "Invalid host name"


class PendingRequest(ResizeError):
    """LSF LSBE_RESIZE_PENDING_REQUEST (374)."""

    code = "LSBE_RESIZE_PENDING_REQUEST"
    lsf_number = 374
    message = "Cannot resize job because there is a pending resize request"
    http_status = 409


class ReleaseFirstHost(ResizeError):
    """LSF LSBE_RESIZE_RELEASE_FRISTHOST_4SLOTS (666)."""

    code = "LSBE_RESIZE_RELEASE_FRISTHOST_4SLOTS"
    lsf_number = 666
    message = "Cannot release all tasks from the first execution host"


class BadSlots(ResizeError):
    """LSF LSBE_RESIZE_BAD_SLOTS_4SLOTS (667)."""

    code = "LSBE_RESIZE_BAD_SLOTS_4SLOTS"
    lsf_number = 667
    message = "Incorrect number of tasks specified"


class ReleaseNoop(ResizeError):
    """LSF LSBE_RESIZE_RELEASE_NOOP_4SLOTS (668)."""

    code = "LSBE_RESIZE_RELEASE_NOOP_4SLOTS"
    lsf_number = 668
    message = "No tasks released"


class RequestNotEnabled(ResizeError):
    """LSF LSBE_RESIZE_REQUEST (754)."""

    code = "LSBE_RESIZE_REQUEST"
    lsf_number = 754
    message = "bresize request is not enabled"
    http_status = 403


class NoJob(ResizeError):
    """LSF LSBE_NO_JOB."""

    code = "LSBE_NO_JOB"
    message = "No matching job found"
    http_status = 404


class NotStarted(ResizeError):
    """LSF LSBE_NOT_STARTED."""

    code = "LSBE_NOT_STARTED"
    message = "Job has not started yet"
    http_status = 409


class JobFinished(ResizeError):
    """LSF LSBE_JOB_FINISH."""

    code = "LSBE_JOB_FINISH"
    message = "Job has already finished"
    http_status = 409


class PermissionDenied(ResizeError):
    """LSF LSBE_PERMISSION."""

    code = "LSBE_PERMISSION"
    message = "User permission denied"
    http_status = 403


class BadJobId(ResizeError):
    """LSF LSBE_BAD_JOBID."""

    code = "LSBE_BAD_JOBID"
    message = "Bad jobId"


class NotAuthenticated(ResizeError):
    """No or unknown credentials (REST 401)."""

    code = "XCE_RESIZE_NOT_AUTHENTICATED"
    message = "Authentication required"
    http_status = 401


class PolicyRejected(ResizeError):
    """A site policy (``xce_resize_validate``) refused the request; detail is its message."""

    code = "XCE_RESIZE_POLICY"
    message = "Rejected by site policy"
    http_status = 409


class InvalidRequest(ResizeError):
    """A request body or option that does not make sense (not an LSF condition)."""

    code = "XCE_RESIZE_INVALID_REQUEST"
    message = "Invalid resize request"
    http_status = 400


class BodyTooLarge(ResizeError):
    """A REST request body over the API's limit (64 KiB)."""

    code = "XCE_RESIZE_BODY_TOO_LARGE"
    message = "Request body too large"
    http_status = 413


class UnsupportedMediaType(ResizeError):
    """A REST request body not declared as JSON."""

    code = "XCE_RESIZE_UNSUPPORTED_MEDIA_TYPE"
    message = "Request body must be JSON (application/json)"
    http_status = 415


class BodyTimeout(ResizeError):
    """A REST request body that did not arrive within the server's body deadline."""

    code = "XCE_RESIZE_BODY_TIMEOUT"
    message = "Request body not received in time"
    http_status = 408


class NoResizeHook(ResizeError):
    """No plugin answered ``xce_resize_*`` (the resize plugin is not registered)."""

    code = "XCE_RESIZE_NO_PLUGIN"
    message = "No resize plugin answered: it is not registered with this controller"
    http_status = 503


class ControllerStopping(ResizeError):
    """The host is stopping (or, in the live controller, was fenced); nothing more is
    accepted, and a long poll in progress is answered with this rather than cut off."""

    code = "XCE_CONTROLLER_STOPPING"
    message = "The controller is stopping"
    http_status = 503


class TooManyRequests(ResizeError):
    """A user has as many REST requests in progress as the server allows one user
    (their jobs' tokens included): refused at once, nothing changed (429)."""

    code = "XCE_TOO_MANY_REQUESTS"
    message = "Too many requests in progress"
    http_status = 429


class Unreachable(ResizeError):
    """The controller did not answer (refused, timed out, no such host)."""

    code = "XCE_RESIZE_UNREACHABLE"
    message = "Cannot reach the controller"
    http_status = 503


class UsageError(ResizeError):
    """Bad command-line syntax; the command exits 2 without contacting the controller."""

    code = "XCE_RESIZE_USAGE"
    message = "Usage error"
    http_status = 400


class PendingJobLimit(ResizeError):
    """LSF's pending job threshold (``MAX_PEND_JOBS``): the submitting user has as many
    pending jobs as the site allows (``[limits] max_pend_jobs``)."""

    code = "LSBE_PJOB_LIMIT"
    message = "Pending job threshold reached"
    http_status = 429


class ConfigError(ResizeError):
    """A configuration, scenario or policy file is wrong; detail names file and reason."""

    code = "XCE_RESIZE_CONFIG"
    message = "Configuration error"
    http_status = 500


class JournalError(ResizeError):
    """The journal cannot be used (corrupt, newer schema, unreadable); names the file."""

    code = "XCE_RESIZE_JOURNAL"
    message = "Journal error"
    http_status = 503


class FencedError(JournalError):
    """A newer controller has started on this state directory; this one must stop."""

    code = "XCE_RESIZE_FENCED"
    message = "Controller fenced by a newer epoch"


# Drain before stop and job events (docs/in-job-api.md).


class GraceTooLong(ResizeError):
    """A drain time above the site's ``[resize] max_stop_grace``."""

    code = "XCE_RESIZE_GRACE_TOO_LONG"
    message = "Drain time above the site maximum"
    http_status = 400


class NotDraining(ResizeError):
    """``drained`` for tasks that no release is draining."""

    code = "XCE_RESIZE_NOT_DRAINING"
    message = "No such task is being drained"
    http_status = 409


class UnknownEventCursor(ResizeError):
    """An events ``after`` cursor the job's event list does not reach."""

    code = "XCE_RESIZE_EVENT_CURSOR"
    message = "Unknown event cursor"
    http_status = 400


class VersionChanged(ResizeError):
    """A grow or release with ``if_version`` found the allocation at another version."""

    code = "XCE_RESIZE_VERSION_CHANGED"
    message = "The job's allocation changed"
    http_status = 409


ERRORS: tuple[type[ResizeError], ...] = (
    NotifyCmdTooLong,
    JobNotResizable,
    BadReleaseHostSpec,
    ResizeInProgress,
    NoActiveRequest,
    HostNotInAlloc,
    BadHost,
    PendingRequest,
    ReleaseFirstHost,
    BadSlots,
    ReleaseNoop,
    RequestNotEnabled,
    NoJob,
    NotStarted,
    JobFinished,
    PermissionDenied,
    BadJobId,
    NotAuthenticated,
    PolicyRejected,
    InvalidRequest,
    BodyTooLarge,
    UnsupportedMediaType,
    BodyTimeout,
    NoResizeHook,
    Unreachable,
    UsageError,
    ConfigError,
    JournalError,
    FencedError,
    GraceTooLong,
    NotDraining,
    UnknownEventCursor,
    VersionChanged,
)

BY_CODE: dict[str, type[ResizeError]] = {e.code: e for e in ERRORS}
