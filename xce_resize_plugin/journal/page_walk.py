"""The checks made on a journal's pages before anything reads them through LMDB.

LMDB has no page checksums and trusts its pages: a damaged page can make the process
reading it die with SIGBUS (a node pointing past the end of the file) instead of
raising. The offline walk of py-lmdb (``lmdb.verify``) reads the file with plain reads,
never through the map, so it reports such damage instead. ``journal verify`` runs it;
``journal export`` and ``journal compact`` run it (and the meta pair check of
:mod:`.meta_pages`) through :func:`require_readable` before they open the journal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.meta_pages import meta_pair_problems, read_metas
from xce_resize_plugin.journal.records import DATA_FILE


def structure_problems(path: Path) -> list[str]:
    """Walk the data file's pages without liblmdb (py-lmdb's offline verifier); each
    problem starts "structure:". Returns an empty list when the module is not
    available."""
    try:
        from lmdb import verify as lmdb_verify
    except ImportError:  # older py-lmdb releases have no offline verifier
        return []
    walk: Callable[..., list[str]] = lmdb_verify.verify
    data_file = path / DATA_FILE
    try:
        problems = walk(str(path), subdir=True)
    except lmdb_verify.VerifyError as exc:
        raise JournalError(f"{data_file}: not a usable LMDB environment ({exc})") from exc
    except OSError as exc:
        raise JournalError(f"{data_file}: cannot read the file ({exc})") from exc
    return [f"structure: {problem}" for problem in problems]


def require_readable(path: Path | str, undone: str) -> None:
    """Raise :class:`JournalError` (one line naming the data file, the first problem and
    ``undone``: "nothing was exported") unless the meta pages and the page structure of
    the journal in ``path`` are sound. A missing data file is left to the opening, which
    says so."""
    path = Path(path).absolute()
    data_file = path / DATA_FILE
    if not data_file.is_file():
        return  # the opening names what is missing (and a FIFO would block the walk)
    problems = _problems_at_rest(path, data_file)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise JournalError(
            f"{data_file}: damaged: {problems[0]}{more}; {undone} "
            f"(`xce-resize journal verify {path}` lists every problem)"
        )


#: Walks tried while a writer keeps committing (a running controller) before the walk
#: is left out.
_WALKS = 3


def _problems_at_rest(path: Path, data_file: Path) -> list[str]:
    """The meta pair's and the structure's problems, from a walk during which no
    transaction was committed. A walk of a file being written sees pages the writer
    reuses, and may report damage that is not there; after :data:`_WALKS` walks that
    each saw a commit, the journal is left to LMDB's read transaction, which is
    consistent under a writer (the running controller checked the file when it
    started: docs/journal-format.md, "Refusing bad journals")."""
    for _ in range(_WALKS):
        before = read_metas(data_file)
        problems = meta_pair_problems(data_file) or structure_problems(path)
        if not problems or read_metas(data_file) == before:
            return problems
    return []
