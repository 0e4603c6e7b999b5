"""Every endpoint of the live controller (its own job routes and the plugin's resize
routes), fed cases generated from its served /openapi.json, positive and negative:
never a 5xx, and nothing changes when a request is refused.

Positive job submissions are not generated: they would run generated commands on this
machine. Submissions are fuzzed with negative (invalid) cases only; valid ones are
covered by the hand-written live tests.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.long_polls import never_hold
from xce_resize_plugin.testing.live import ROOT, LiveCluster, wait_until

EXAMPLES = 150


def quiet(live: LiveCluster) -> None:
    """Wait until no change is in flight: the live controller completes accepted
    changes in the background, and a snapshot taken mid-change would move."""

    def settled() -> bool:
        jobs = live.ok("GET", "/v1/jobs", ROOT)["jobs"]
        return all(not (j.get("resize") or {}).get("in_flight") for j in jobs)

    wait_until(settled, 15, "changes in flight to finish")


def snapshot(live: LiveCluster) -> Any:
    cluster = live.cluster()
    jobs = live.ok("GET", "/v1/jobs", ROOT)["jobs"]
    return (
        cluster["hosts"],
        cluster["users"],
        [(j["id"], j["state"], j["version"], j["hosts"], j.get("resize")) for j in jobs],
    )


def _valid_wait(value: object) -> bool:
    """A wait the server would accept and honour (a number of seconds >= 0)."""
    try:
        return float(value) >= 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def test_fuzz_every_live_endpoint(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job = live.submit(min_tasks=1, max_tasks=3, resizable=True, alloc={"h1": 1})
    live.running(job, 1)
    schema = schemathesis.openapi.from_url(live.url("/openapi.json"))
    strategies = []
    for result in schema.get_all_operations():
        op = result.ok()
        modes = [GenerationMode.NEGATIVE]
        if not (op.method.upper() == "POST" and op.path == "/v1/jobs"):
            modes.append(GenerationMode.POSITIVE)
        for mode in modes:
            for ids in ({"id": job}, {"id": "999999"}, None):
                params = ids if "{id}" in op.path else None
                strategies.append(
                    op.as_strategy(
                        mode, headers={"Authorization": f"Bearer {ROOT}"}, path_parameters=params
                    )
                )

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=st.one_of(strategies))
    def run(case: Any) -> None:
        # Never hold the connection (tests/long_polls.py): the events' default wait is
        # 30 s, the client's timeout.
        if case.path.endswith(("/wait", "/events")) or "/kv/" in case.path:
            never_hold(case, "wait" if "/kv/" in case.path else "timeout", _valid_wait)
        if case.method.upper() == "DELETE" and case.path == "/v1/jobs/{id}":
            return  # killing the job is a valid change, tested by hand; keep it running
        quiet(live)
        before = snapshot(live)
        response = case.call(base_url=live.url(), timeout=30)
        assert response.status_code < 500, (case.method, case.path, response.text)
        if response.status_code >= 400:
            ctype = response.headers["content-type"]
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            assert ctype.startswith("application/problem+json"), (case.path, ctype)
            assert snapshot(live) == before, (case.method, case.path, response.text)

    run()
    assert live.cluster()["problems"] == []
