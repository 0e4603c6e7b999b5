"""Whether the ``PATH`` other users' jobs are given (``runners.DEFAULT_PATH``) can be
changed by someone other than root: a directory in it, or above it, that a group or
everyone may write would let those users plant commands (``ls``, ``python3``) that
every other user's job then runs, as that user (docs/admin-guide.md, "PATH").

Checked once at the start of a root controller whose jobs run as their owners, and
told as a warning: the site's own layout (``/usr/local/bin`` is ``root:staff 2775`` on
older Debian) is the administrator's to change, not the controller's to refuse.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def unsafe_path_entries(path: str) -> list[str]:
    """One line per entry of ``path`` that someone other than root could change: the
    entry not root's or writable by its group or everyone (a sticky one such as
    ``/tmp`` too: anyone may add a command), or a directory above it that is not
    root's, or writable by others without the sticky bit (an entry could be renamed
    away and replaced), or writable by others at all above a part that does not exist
    yet (anyone could make it)."""
    out: list[str] = []
    for entry in path.split(os.pathsep):
        if not os.path.isabs(entry):
            continue
        made_here = True  # the names in this part are made by whoever may write it
        for part in (Path(entry), *Path(entry).parents):
            try:
                st = os.stat(part)
            except OSError:
                made_here = True  # missing: whoever may write above may make it
                continue
            mode = stat.S_IMODE(st.st_mode)
            others_write = bool(mode & 0o022)
            if st.st_uid != 0 or (others_write and (made_here or not mode & stat.S_ISVTX)):
                out.append(
                    f"{entry}: {part} is owned by uid {st.st_uid}, mode {mode:04o}: "
                    "someone other than root can put commands there"
                )
                break
            made_here = False
    return out
