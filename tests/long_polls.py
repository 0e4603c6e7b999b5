"""Fuzzed long polls that never hold the connection (the schemathesis tests).

A generated case for a long poll (a change's wait, a job's events, a key-value wait)
must not keep the server waiting for its default (30 s) or for a long valid wait: the
client gives up first and the test fails for the harness's sake. What the server sees
is what the HTTP client sends, and ``requests`` (schemathesis's transport) flattens a
parameter's value: a list, a tuple or a dict's keys go as one parameter per item,
``None`` and empty collections not at all (so the default wait applies), so ``[25]``
and ``{"25": 1}`` both wait 25 s. The parameters sent are therefore read from the
request ``requests`` builds, not guessed. (schemathesis itself sends an empty dict as
an empty value, which the server refuses; read as not sent here, such a case only
becomes a zero wait.) A case in which the parameter is not sent, or
is sent once with a valid wait, waits 0 s instead; every other case is left as
generated, for the server to refuse.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

import requests


def sent_values(query: dict[str, Any], name: str) -> list[str]:
    """The values of parameter ``name`` in the request ``requests`` builds from ``query``."""
    url = requests.Request("GET", "http://127.0.0.1/", params=query).prepare().url
    assert url is not None
    parsed = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query, keep_blank_values=True)
    return parsed.get(name, [])


def never_hold(case: Any, name: str, valid: Callable[[str], bool]) -> None:
    """Set the long poll's wait parameter ``name`` to 0 when the server would honour
    what the case sends (nothing, or one ``valid`` value). A query that is not a
    mapping is sent as none, so it becomes ``{name: 0}``."""
    query = case.query if isinstance(case.query, dict) else {}
    sent = sent_values(query, name)
    if not sent or (len(sent) == 1 and valid(sent[0])):
        case.query = {**query, name: 0}
