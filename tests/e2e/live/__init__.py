"""The live controller's end-to-end tests: real processes on loopback.

Every module here is skipped where the live controller cannot run: without Linux
(``/proc``, ``flock``) or without the ``live`` extra (httpx, uvicorn, starlette).
"""

import sys

import pytest

for _module in ("httpx", "uvicorn", "starlette"):
    pytest.importorskip(_module)

if not sys.platform.startswith("linux"):  # pragma: no cover
    pytest.skip("the live controller needs Linux (/proc, flock)", allow_module_level=True)
