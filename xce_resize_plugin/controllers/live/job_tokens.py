"""Job tokens, derived and never stored (docs/live-controller.md, "Tokens").

A job's token (``XCE_JOB_TOKEN`` in its tasks, returned by ``POST /v1/jobs``) is
``<job id>.<mac>``, ``mac`` being HMAC-SHA256 under the controller's key of the job id
and a salt, in unpadded base64url. The key is a random secret in
``state_dir/job-token.key`` (mode 0600, created at the first start); the salt, 16
random bytes, is kept in the job's side record. Neither the controller's store nor the
plugin's journal holds a token, nor anything a token can be computed from without the
key: a copy of them (a backup, a replica, ``mdb_dump``) lets nobody act as a job.

The controller derives a job's token again whenever it hands it out (a task starts, a
notification command runs), after a restart too: the tasks a grow starts after a
failover get the same token as the job's first tasks. The salt keeps tokens apart when
a job id is issued again (a state directory restored from an older backup).

The store records the key's fingerprint (its SHA-256): a controller that finds another
key, or none, refuses to start rather than hand out tokens that the running tasks'
do not match.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Final

from attrs import frozen

from xce_resize_plugin.controllers.live.proc import secret_file
from xce_resize_plugin.controllers.violations import StoreError

__all__ = ["FINGERPRINT_KEY", "KEY_FILE", "SALT_FIELD", "TOKEN_ENV", "JobTokens"]

#: The key's file, in the state directory.
KEY_FILE: Final = "job-token.key"
#: The side record holding the key's fingerprint.
FINGERPRINT_KEY: Final = "job_token_key"
#: The field of a job's side record holding its token's salt.
SALT_FIELD: Final = "token_salt"
#: The environment variable that gives a task its job's token.
TOKEN_ENV: Final = "XCE_JOB_TOKEN"
_LABEL: Final = b"xce-job-token"


@frozen(repr=False)
class JobTokens:
    """Derives and checks job tokens under one key (never shown in a repr)."""

    key: bytes
    path: Path

    @classmethod
    def load(cls, state_dir: Path, recorded: str | None) -> JobTokens:
        """The key of ``state_dir``; ``recorded`` is the fingerprint the store holds.

        Without a recorded fingerprint (a new state directory) the key file is created
        if missing. With one, the file must exist and hold that key: else
        :class:`StoreError` naming the file, since the running jobs' tokens could not
        be derived again.
        """
        path = state_dir / KEY_FILE
        try:
            text = secret_file(path, create=recorded is None)
        except FileNotFoundError:
            raise StoreError(
                f"{path}: missing, but the controller's store holds job tokens derived "
                "from it: restore it with the rest of the state directory"
            ) from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot read the job token key: {exc}") from exc
        if not text:
            raise StoreError(f"{path}: the job token key is empty")
        tokens = cls(text.encode(), path)
        if recorded is not None and not hmac.compare_digest(recorded, tokens.fingerprint):
            raise StoreError(
                f"{path}: not the key this state directory's job tokens derive from (the "
                "controller's store records another): restore it with the rest of the "
                "state directory"
            )
        return tokens

    def __repr__(self) -> str:
        return f"<JobTokens {self.path}>"

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the key, hex: what the store records (it reveals nothing of it)."""
        return hashlib.sha256(self.key).hexdigest()

    @staticmethod
    def new_salt() -> str:
        """A new job's salt (hex)."""
        return secrets.token_hex(16)

    def token(self, job_id: str, salt: str) -> str:
        """The token of job ``job_id`` whose side record holds ``salt``."""
        message = b"\0".join((_LABEL, job_id.encode(), salt.encode()))
        mac = hmac.new(self.key, message, hashlib.sha256).digest()
        return f"{job_id}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"

    @staticmethod
    def job_of(token: str) -> str | None:
        """The job a token claims to be for (``None``: not a job token's shape)."""
        job_id, dot, mac = token.rpartition(".")
        return job_id if dot and job_id and mac else None

    def matches(self, token: str, job_id: str, salt: str) -> bool:
        """Whether ``token`` is job ``job_id``'s (constant-time comparison)."""
        return hmac.compare_digest(token.encode(), self.token(job_id, salt).encode())
