"""What a sweep's runs read: a trace's identity (part of every cache key, :mod:`.sweep`)
and the trace opened as that identity says.

The identity of an SWF trace is the SHA-256 of its file; of an ElastiSim workload, of
every file its reader reads (the jobs, ``configuration.json``, the platform, the
application models: :func:`~.elastisim.elastisim_inputs`), each with its name, so a
changed platform is another workload. The sweep computes identities when it loads its
file; a run reads its trace again much later, so :func:`open_identified` makes sure it
reads the same content: an SWF file is read once into memory, hashed and parsed from
those bytes (what is simulated is what was hashed), and an ElastiSim workload's files
are hashed before the run and after it (:func:`check_identity`). A trace changed in
between stops the sweep (``SimulationError``) instead of caching another trace's
results under this one's key.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

from xce_resize_plugin.simulation.elastisim import elastisim_inputs
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.simulate import (
    SimOptions,
    SimulationError,
    Workload,
    load_workload,
    workload_of,
)
from xce_resize_plugin.simulation.swf import read_swf

__all__ = ["check_identity", "is_swf", "open_identified", "trace_identity"]

_BLOCK = 1 << 20


def is_swf(path: str | os.PathLike[str]) -> bool:
    """Whether ``read_trace`` reads ``path`` as SWF (by name, as it chooses)."""
    return os.fspath(path).lower().endswith((".swf", ".swf.gz"))


def _swf_identity(data: bytes) -> str:
    return f"trace {hashlib.sha256(data).hexdigest()}"


def trace_identity(path: str | os.PathLike[str]) -> str:
    """The identity of the trace at ``path`` (see the module docstring)."""
    if is_swf(path):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                digest.update(block)
        return f"trace {digest.hexdigest()}"
    digest = hashlib.sha256()
    jobs = Path(path) / "jobs.json" if Path(path).is_dir() else Path(path)  # as read_trace
    for file in elastisim_inputs(jobs):
        data = file.read_bytes()
        name = file.name.encode()
        # Name and length delimit each file: no two sets of files hash the same bytes.
        digest.update(b"%d:%s %d:" % (len(name), name, len(data)))
        digest.update(data)
    return f"elastisim {digest.hexdigest()}"


def _changed(source: str) -> SimulationError:
    return SimulationError(
        f"{source}: the trace changed since the sweep began (its results would be "
        "cached as the earlier content's); run the sweep again"
    )


def check_identity(source: str, identity: str) -> None:
    """Raise ``SimulationError`` if the trace at ``source`` is no longer ``identity``."""
    try:
        now = trace_identity(source)
    except OSError as exc:
        raise SimulationError(f"{source}: cannot read the trace again ({exc})") from None
    if now != identity:
        raise _changed(source)


@gc_paused
def open_identified(source: str, identity: str, options: SimOptions) -> Workload:
    """The workload of the trace at ``source``, which must still be ``identity``."""
    if not is_swf(source):
        check_identity(source, identity)
        return load_workload(source, options)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise SimulationError(f"{source}: cannot read the trace again ({exc})") from None
    if _swf_identity(data) != identity:
        raise _changed(source)
    stream = io.BytesIO(data)
    stream.name = source  # the reader's messages name the file
    return workload_of(read_swf(stream, limit=options.limit), source, options)
