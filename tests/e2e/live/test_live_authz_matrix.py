"""Who may do what, on every route the live controller serves.

One real controller with real jobs. The routes are read from the controller's own
``GET /openapi.json`` (which lists exactly what it serves), so a route added later is
exercised too, or fails this test until :data:`POLICY` classifies it. Every route and
method is sent by every kind of principal (:data:`KINDS`) and the answer must be what
:data:`POLICY` says:

- an allowed request succeeds (and, for a change, really changes what it says; the
  test then puts the job back as it was);
- a refusal is the documented problem document (401 with ``WWW-Authenticate``, 403
  ``LSBE_PERMISSION``, or 404 ``LSBE_NO_JOB`` exactly as the same caller gets for a job
  id that no job has), and changes nothing (jobs, allocations and versions, resize
  state, key-value store, events, hosts);
- no answer holds a token, and the listing routes show each principal only what it
  may see.

All the findings of one run are reported together, one line per route and principal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, SLEEPER, LiveCluster, wait_until

SCRAPE = "scrape-token-for-the-matrix-0123"
UNKNOWN = "no-such-token-0123456789abcdef"
MISSING = "987654"  # a job id no job has
KV_KEY, KV_VALUE = "matrix", "a value only the job's principals may read"
#: The target job's size (tasks) between two requests: room to release and to grow.
SIZE, MAX_TASKS = 4, 8

# -- the principals --------------------------------------------------------------------

NONE = "no token"
UNKNOWN_TOKEN = "an unknown token"
FORGED = "a forged job token (right shape, wrong MAC)"
ENDED_JOB = "the token of a job that ended"
SCRAPER = "the metrics scrape token"
OTHER_USER = "another user"
OWNER = "the job's owner"
ADMIN = "an administrator"
OWN_JOB = "the job's own token"
SIBLING_JOB = "another job's token, same owner"
FOREIGN_JOB = "a job token of another owner's job"
ADMIN_JOB = "a job token of an administrator's job"
KINDS = (
    NONE,
    UNKNOWN_TOKEN,
    FORGED,
    ENDED_JOB,
    SCRAPER,
    OTHER_USER,
    SIBLING_JOB,
    FOREIGN_JOB,
    ADMIN_JOB,
    OWNER,
    ADMIN,
    OWN_JOB,
)
JOB_TOKENS = (OWN_JOB, SIBLING_JOB, FOREIGN_JOB, ADMIN_JOB)
#: Whose name each signed-in principal carries (a job token stands for its owner).
USER_OF = {
    OTHER_USER: "bob",
    OWNER: "alice",
    ADMIN: "root",
    OWN_JOB: "alice",
    SIBLING_JOB: "alice",
    FOREIGN_JOB: "bob",
    ADMIN_JOB: "root",
}


@dataclass(frozen=True)
class Refused:
    """The refusal a principal must get: status and problem code."""

    status: int
    code: str


OK = "ok"
UNAUTH = Refused(401, "XCE_RESIZE_NOT_AUTHENTICATED")
DENIED = Refused(403, "LSBE_PERMISSION")
NO_JOB = Refused(404, "LSBE_NO_JOB")
Row = dict[str, str | Refused]

# -- the policy (what the documents say) ----------------------------------------------

# No or an unknown token, and the scrape token anywhere but /metrics: 401
# (docs/rest-api.md "Authentication and who may do what"; docs/live-controller.md
# "Tokens": the scrape token "may read GET /metrics and nothing else", and a job token
# "stops working when the job ends").
_NOT_SIGNED_IN: Row = dict.fromkeys((NONE, UNKNOWN_TOKEN, FORGED, ENDED_JOB, SCRAPER), UNAUTH)
#: No token needed (docs/live-controller.md "Tokens": /v1/health and /openapi.json).
PUBLIC: Row = dict.fromkeys(KINDS, OK)
#: Any user or job token; what each sees is filtered (docs/live-controller.md
#: "REST API": GET /v1/jobs, GET /v1/cluster; docs/admin-guide.md, host states).
SIGNED_IN: Row = {**_NOT_SIGNED_IN, **dict.fromkeys(USER_OF, OK)}
#: Users and administrators; a job token "cannot submit" (docs/live-controller.md
#: "Tokens").
USERS: Row = {**SIGNED_IN, **dict.fromkeys(JOB_TOKENS, DENIED)}
#: Administrators only, anyone else signed in 403 (docs/admin-guide.md "Host states,
#: failures and drains": host commands).
ADMINS: Row = {**SIGNED_IN, **dict.fromkeys((OTHER_USER, OWNER, *JOB_TOKENS), DENIED)}
#: Administrators and the scrape token; other users and job tokens 403
#: (docs/live-controller.md "REST API", GET /metrics).
METRICS: Row = {**ADMINS, SCRAPER: OK}
#: A route that names a job: its owner, an administrator, its own token; anyone else
#: is answered as for a job that does not exist (docs/rest-api.md "Authentication and
#: who may do what": "A job you may not see does not exist for you").
THE_JOB: Row = {
    **_NOT_SIGNED_IN,
    **dict.fromkeys((OWNER, ADMIN, OWN_JOB), OK),
    **dict.fromkeys((OTHER_USER, SIBLING_JOB, FOREIGN_JOB, ADMIN_JOB), NO_JOB),
}

POLICY: dict[tuple[str, str], Row] = {
    ("GET", "/v1/health"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/metrics"): METRICS,
    ("GET", "/v1/jobs"): SIGNED_IN,
    ("POST", "/v1/jobs"): USERS,
    ("GET", "/v1/cluster"): SIGNED_IN,
    ("GET", "/v1/hosts"): SIGNED_IN,
    ("POST", "/v1/hosts/{name}/{action}"): ADMINS,
    ("GET", "/v1/jobs/{id}"): THE_JOB,
    ("DELETE", "/v1/jobs/{id}"): THE_JOB,
    ("PATCH", "/v1/jobs/{id}"): THE_JOB,
    ("PUT", "/v1/jobs/{id}/kv/{key}"): THE_JOB,
    ("GET", "/v1/jobs/{id}/kv/{key}"): THE_JOB,
    ("DELETE", "/v1/jobs/{id}/kv/{key}"): THE_JOB,
    ("GET", "/v1/jobs/{id}/resize"): THE_JOB,
    ("POST", "/v1/jobs/{id}/resize/grow"): THE_JOB,
    ("POST", "/v1/jobs/{id}/resize/release"): THE_JOB,
    ("DELETE", "/v1/jobs/{id}/resize/pending"): THE_JOB,
    ("GET", "/v1/jobs/{id}/resize/history"): THE_JOB,
    ("GET", "/v1/jobs/{id}/resize/wait"): THE_JOB,
    ("POST", "/v1/jobs/{id}/tasks/{task_id}/ready"): THE_JOB,
    ("POST", "/v1/jobs/{id}/resize/drained"): THE_JOB,
    ("GET", "/v1/jobs/{id}/events"): THE_JOB,
    ("PUT", "/v1/jobs/{id}/resize/target"): THE_JOB,
    ("DELETE", "/v1/jobs/{id}/resize/target"): THE_JOB,
}

# -- the cluster under test ------------------------------------------------------------


@dataclass
class World:
    """The controller, the target job (alice's, resizable: every ``{id}``), the token
    of each principal kind, and the job each job token stands for."""

    live: LiveCluster
    target: str
    tokens: dict[str, str | None]
    jobs: dict[str, str]
    secrets: list[str]
    #: The test's client: one connection per request, since a kept-alive connection
    #: waits 40 ms per request for a delayed ACK, and one client, since a new client per
    #: request costs 20 ms.
    client: httpx.Client
    draining: list[int] = field(default_factory=list)
    #: The state as the last refusal left it: the next refusal must leave it so too.
    seen: dict[str, Any] | None = None

    def get(self, path: str) -> Any:
        answer = self.client.get(path, headers={"Authorization": f"Bearer {ROOT}"})
        assert answer.status_code == 200, (path, answer.text)
        return answer.json()

    def resize(self) -> dict[str, Any]:
        return dict(self.get(f"/v1/jobs/{self.target}/resize"))

    def owners(self) -> dict[str, str]:
        return {j["id"]: j["user"] for j in self.get("/v1/jobs")["jobs"]}


def _submit(live: LiveCluster, token: str, **body: Any) -> tuple[str, str]:
    answer = live.ok("POST", "/v1/jobs", token, {"command": SLEEPER, **body})
    return str(answer["id"]), str(answer["token"])


def _client(live: LiveCluster) -> httpx.Client:
    no_keepalive = httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=live.url(), limits=no_keepalive, timeout=30)


def _world(live: LiveCluster) -> World:
    tasks = f"1,{MAX_TASKS}"
    target, own = _submit(live, ALICE, tasks=tasks, resizable=True, initial=SIZE)
    sibling, sibling_token = _submit(live, ALICE, tasks=1)
    foreign, foreign_token = _submit(live, BOB, tasks=1)
    admins, admin_token = _submit(live, ROOT, tasks=1)
    ended, ended_token = _submit(live, ALICE, tasks=1)
    live.ok("DELETE", f"/v1/jobs/{ended}", ALICE)
    for job_id, size in ((target, SIZE), (sibling, 1), (foreign, 1), (admins, 1)):
        live.running(job_id, size)
    wait_until(lambda: live.job(ended)["state"] == "EXIT", 15, f"job {ended} killed")
    live.ok("PUT", f"/v1/jobs/{target}/kv/{KV_KEY}", ROOT, {"value": KV_VALUE})
    tokens: dict[str, str | None] = {
        NONE: None,
        UNKNOWN_TOKEN: UNKNOWN,
        FORGED: f"{target}.{'A' * 43}",
        ENDED_JOB: ended_token,
        SCRAPER: SCRAPE,
        OTHER_USER: BOB,
        OWNER: ALICE,
        ADMIN: ROOT,
        OWN_JOB: own,
        SIBLING_JOB: sibling_token,
        FOREIGN_JOB: foreign_token,
        ADMIN_JOB: admin_token,
    }
    jobs = {OWN_JOB: target, SIBLING_JOB: sibling, FOREIGN_JOB: foreign, ADMIN_JOB: admins}
    secrets = [t for t in tokens.values() if t is not None and t != UNKNOWN]
    return World(live, target, tokens, jobs, secrets, _client(live))


def _idle(world: World) -> dict[str, Any]:
    """The target's resize status once nothing pends or is in flight."""

    def settled() -> dict[str, Any] | None:
        status = world.resize()
        quiet = status["pending"] is None and status["in_flight"] is None
        return status if quiet and status["phase"] == "IDLE" else None

    return dict(wait_until(settled, 20, f"job {world.target} idle"))


def _settle(world: World) -> None:
    """Put the target back as it was before an allowed change: no target, autoresize
    off, nothing pending, :data:`SIZE` tasks."""
    live, path = world.live, f"/v1/jobs/{world.target}"
    assert live.call("DELETE", f"{path}/resize/target", ROOT).status_code == 200
    assert live.call("PATCH", path, ROOT, {"autoresize": False}).status_code == 200
    live.call("DELETE", f"{path}/resize/pending", ROOT)  # 409 when nothing pends
    for _ in range(SIZE):
        size = len(_idle(world)["tasks"])
        if size == SIZE:
            return
        if size < SIZE:
            answer = live.grow(world.target, SIZE - size, token=ROOT)
        else:
            answer = live.release(world.target, token=ROOT, count=size - SIZE)
        assert answer.status_code == 202, answer.text
    raise AssertionError(f"job {world.target} not back to {SIZE} tasks: {world.resize()}")


# -- how each route is exercised -------------------------------------------------------

Check = Callable[[World, str, httpx.Response], list[str]]


@dataclass(frozen=True)
class Probe:
    """How to send a route's request: its success status, body (or a function of the
    world making it), query string; ``prepare`` runs before each principal's request
    (e.g. so that a cancel has a grow to cancel; true when it changed something);
    ``after`` checks an allowed answer
    and undoes its change; with ``fresh``, each allowed principal acts on a new job of
    the owner (a kill cannot be undone), its own token being that job's."""

    ok: int = 200
    body: Any = None
    query: str = ""
    prepare: Callable[[World], bool] | None = None
    after: Check | None = None
    fresh: bool = False


def _may_see(world: World, kind: str, job_id: str, owner: str) -> bool:
    """Whether ``kind`` may see the job, as the documents say."""
    if kind == ADMIN:
        return True
    if kind in JOB_TOKENS:
        return job_id == world.jobs[kind]
    return owner == USER_OF[kind]


def _home(world: World, kind: str) -> str:
    """A job ``kind`` must see in a listing (its own, or its owner's)."""
    if kind in JOB_TOKENS:
        return world.jobs[kind]
    return world.jobs[{OWNER: OWN_JOB, OTHER_USER: FOREIGN_JOB, ADMIN: FOREIGN_JOB}[kind]]


def _listed(world: World, kind: str, listed: set[str]) -> list[str]:
    owners = world.owners()
    hidden = sorted(j for j in listed if not _may_see(world, kind, j, owners.get(j, "?")))
    out = [f"shows jobs it may not see: {hidden}"] if hidden else []
    if _home(world, kind) not in listed:
        out.append(f"does not show job {_home(world, kind)}, which it may see")
    return out


def _jobs_listing(world: World, kind: str, answer: httpx.Response) -> list[str]:
    return _listed(world, kind, {j["id"] for j in answer.json()["jobs"]})


def _hosts_listing(world: World, kind: str, answer: httpx.Response) -> list[str]:
    return _listed(world, kind, {j for h in answer.json()["hosts"] for j in h["jobs"]})


def _cluster_listing(world: World, kind: str, answer: httpx.Response) -> list[str]:
    doc = answer.json()
    if kind == ADMIN:
        return [] if "problems" in doc and {"alice", "bob"} <= set(doc["users"]) else [str(doc)]
    out = [] if set(doc["users"]) == {USER_OF[kind]} else [f"users: {sorted(doc['users'])}"]
    if "problems" in doc or any(set(h["worker"]) != {"ready"} for h in doc["hosts"].values()):
        out.append(f"shows administrators' details: {doc}")
    return out


def _the_job(world: World, kind: str, answer: httpx.Response) -> list[str]:
    job_id = answer.json().get("id") or answer.json().get("job_id")
    return [] if job_id == world.target else [f"answered about job {job_id}"]


def _submitted(world: World, kind: str, answer: httpx.Response) -> list[str]:
    doc = answer.json()
    world.live.ok("DELETE", f"/v1/jobs/{doc['id']}", ROOT)
    wait_until(lambda: world.live.job(doc["id"])["state"] == "EXIT", 15, "the kill")
    user = doc["job"]["user"]
    return [] if user == USER_OF[kind] else [f"submitted a job of {user}"]


def _killed(world: World, kind: str, answer: httpx.Response) -> list[str]:
    job_id = answer.json()["id"]
    wait_until(lambda: world.live.job(job_id)["state"] == "EXIT", 15, f"job {job_id} killed")
    return []


def _changed(expect: Callable[[dict[str, Any]], bool]) -> Check:
    """An allowed change of the target: its answer says it happened; then undone."""

    def check(world: World, kind: str, answer: httpx.Response) -> list[str]:
        doc = answer.json()
        _settle(world)
        return [] if expect(doc) else [f"the answer does not show the change: {doc}"]

    return check


def _host_closed(world: World, kind: str, answer: httpx.Response) -> list[str]:
    world.live.ok("POST", "/v1/hosts/h2/open", ROOT)
    return [] if answer.json()["state"] == "closed" else [f"not closed: {answer.text}"]


def _pending(world: World) -> bool:
    """A grow of the target that cannot be placed (4 more, 1 slot free), to cancel."""
    if world.resize()["pending"] is not None:
        return False
    answer = world.live.grow(world.target, 4, token=ROOT, min_tasks=4)
    assert answer.status_code == 202, answer.text
    return True


def _target_set(world: World) -> bool:
    if world.resize()["target"] is not None:
        return False
    world.live.ok("PUT", f"/v1/jobs/{world.target}/resize/target", ROOT, {"tasks": SIZE})
    return True


def _draining(world: World) -> bool:
    """A release of the target's newest task in its drain time, to say it drained."""
    if world.resize()["phase"] == "SHRINK_DRAINING":
        return False
    newest = max(t["id"] for t in _idle(world)["tasks"])
    answer = world.live.release(world.target, token=ROOT, task_ids=[newest], grace=120)
    assert answer.status_code == 202, answer.text
    wait_until(lambda: world.resize()["phase"] == "SHRINK_DRAINING", 15, "the drain")
    world.draining = [newest]
    return True


def _kv_value(world: World, kind: str, answer: httpx.Response) -> list[str]:
    return [] if answer.json()["value"] == KV_VALUE else [f"value: {answer.text}"]


def _kv_removed(world: World, kind: str, answer: httpx.Response) -> list[str]:
    """The removed record answered, the key gone; then set again (undone)."""
    problems = _kv_value(world, kind, answer)
    path = f"/v1/jobs/{world.target}/kv/{KV_KEY}"
    gone = world.client.get(path, headers={"Authorization": f"Bearer {ROOT}"})
    if gone.status_code != 404:
        problems.append(f"the key is still there: {gone.status_code} {gone.text}")
    world.live.ok("PUT", path, ROOT, {"value": KV_VALUE})
    return problems


def _drained_body(world: World) -> dict[str, Any]:
    return {"task_ids": world.draining}


PROBES: dict[tuple[str, str], Probe] = {
    ("GET", "/v1/health"): Probe(),
    ("GET", "/openapi.json"): Probe(),
    ("GET", "/metrics"): Probe(),
    ("GET", "/v1/jobs"): Probe(after=_jobs_listing),
    ("POST", "/v1/jobs"): Probe(201, {"command": SLEEPER, "tasks": 1}, after=_submitted),
    ("GET", "/v1/cluster"): Probe(after=_cluster_listing),
    ("GET", "/v1/hosts"): Probe(after=_hosts_listing),
    ("POST", "/v1/hosts/{name}/{action}"): Probe(after=_host_closed),
    ("GET", "/v1/jobs/{id}"): Probe(after=_the_job),
    ("DELETE", "/v1/jobs/{id}"): Probe(202, after=_killed, fresh=True),
    ("PATCH", "/v1/jobs/{id}"): Probe(
        body={"autoresize": True}, after=_changed(lambda doc: doc["autoresize"] is True)
    ),
    ("PUT", "/v1/jobs/{id}/kv/{key}"): Probe(body={"value": KV_VALUE}, after=_kv_value),
    ("GET", "/v1/jobs/{id}/kv/{key}"): Probe(query="?wait=0", after=_kv_value),
    ("DELETE", "/v1/jobs/{id}/kv/{key}"): Probe(after=_kv_removed),
    ("GET", "/v1/jobs/{id}/resize"): Probe(after=_the_job),
    ("POST", "/v1/jobs/{id}/resize/grow"): Probe(
        202, {"tasks": 1}, after=_changed(lambda doc: doc["pending"] or doc["in_flight"])
    ),
    ("POST", "/v1/jobs/{id}/resize/release"): Probe(
        202, {"count": 1}, after=_changed(lambda doc: doc["phase"] != "IDLE")
    ),
    ("DELETE", "/v1/jobs/{id}/resize/pending"): Probe(
        prepare=_pending, after=_changed(lambda doc: doc["pending"] is None)
    ),
    ("GET", "/v1/jobs/{id}/resize/history"): Probe(),
    ("GET", "/v1/jobs/{id}/resize/wait"): Probe(query="?version=0&timeout=0", after=_the_job),
    ("POST", "/v1/jobs/{id}/tasks/{task_id}/ready"): Probe(),
    ("POST", "/v1/jobs/{id}/resize/drained"): Probe(
        body=_drained_body,
        prepare=_draining,
        after=_changed(lambda doc: doc["phase"] != "SHRINK_DRAINING"),
    ),
    ("GET", "/v1/jobs/{id}/events"): Probe(query="?timeout=0"),
    ("PUT", "/v1/jobs/{id}/resize/target"): Probe(
        body={"tasks": SIZE}, after=_changed(lambda doc: doc["target"]["tasks"] == SIZE)
    ),
    ("DELETE", "/v1/jobs/{id}/resize/target"): Probe(
        prepare=_target_set, after=_changed(lambda doc: doc["target"] is None)
    ),
}

# -- sending and checking --------------------------------------------------------------


def _send(world: World, route: tuple[str, str], job_id: str, token: str | None) -> httpx.Response:
    method, template = route
    probe = PROBES[route]
    path = template.format(id=job_id, key=KV_KEY, task_id=0, name="h2", action="close")
    body = probe.body(world) if callable(probe.body) else probe.body
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return world.client.request(method, path + probe.query, json=body, headers=headers)


def _snapshot(world: World) -> dict[str, Any]:
    """What a refused request must not change: every job (state, allocation, version,
    tasks and their processes, resize state, notifications, records), the hosts, the
    target's key-value store and events."""
    target = world.target
    kv = world.client.get(
        f"/v1/jobs/{target}/kv/{KV_KEY}", headers={"Authorization": f"Bearer {ROOT}"}
    )
    jobs = {}
    for job in world.get("/v1/jobs")["jobs"]:
        facts = {k: job[k] for k in ("state", "version", "allocation", "held", "ending")}
        facts["tasks"] = [(t["id"], t["state"], t["pid"]) for t in job["tasks"]]
        facts["resize"] = job["resize"]
        facts["notifications"] = len(job["notifications"])
        facts["records"] = job["accounting"]["resize_records"]
        jobs[job["id"]] = facts
    return {
        "jobs": jobs,
        "hosts": world.get("/v1/hosts")["hosts"],
        "kv": (kv.status_code, kv.text),
        "events": world.get(f"/v1/jobs/{target}/events?timeout=0"),
    }


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two snapshots, part by part (each job on its own)."""
    parts = [(f"job {j}", before["jobs"].get(j), after["jobs"].get(j)) for j in after["jobs"]]
    parts += [(k, before[k], after[k]) for k in ("hosts", "kv", "events")]
    parts.append(("the jobs", sorted(before["jobs"]), sorted(after["jobs"])))
    return [f"{what}: {old} -> {new}" for what, old, new in parts if old != new]


def _refusal(
    world: World, route: tuple[str, str], kind: str, expect: Refused, answer: httpx.Response
) -> list[str]:
    """What is wrong with ``answer`` as the refusal ``expect``."""
    if answer.status_code != expect.status:
        return [f"answered {answer.status_code} {answer.text[:300]}, expected {expect}"]
    if not answer.headers.get("content-type", "").startswith("application/problem+json"):
        return [f"not a problem document: {answer.text[:300]}"]
    doc = answer.json()
    out = [] if doc.get("code") == expect.code else [f"code {doc.get('code')}, not {expect.code}"]
    if expect.status == 401 and answer.headers.get("www-authenticate") != 'Bearer realm="xce"':
        out.append("a 401 without WWW-Authenticate")
    if expect == NO_JOB:
        # Exactly what the same caller gets for a job id no job has, but for the id.
        twin = _send(world, route, MISSING, world.tokens[kind])
        if json.loads(twin.text.replace(MISSING, world.target)) != doc:
            out.append(f"tells the job exists: {answer.text} but {twin.text} for none")
    return out


def _check(world: World, route: tuple[str, str], kind: str) -> list[str]:
    """Send ``route`` as ``kind``; what is wrong with what happened."""
    expect, probe = POLICY[route][kind], PROBES[route]
    if probe.prepare is not None and probe.prepare(world):
        world.seen = None
    job_id, token = world.target, world.tokens[kind]
    if probe.fresh and expect == OK:
        job_id, own = _submit(world.live, ALICE, tasks=1)
        token = own if kind == OWN_JOB else token
    before = None
    if expect != OK and route[0] != "GET":
        before = world.seen or _snapshot(world)
    else:
        world.seen = None  # an allowed request may change anything
    answer = _send(world, route, job_id, token)
    problems = [
        f"the answer holds a token: {answer.text[:300]}" for t in world.secrets if t in answer.text
    ]
    if isinstance(expect, Refused):
        problems += _refusal(world, route, kind, expect, answer)
    elif answer.status_code != probe.ok:
        problems.append(f"answered {answer.status_code} {answer.text[:300]}, expected {probe.ok}")
    elif probe.after is not None:
        problems += probe.after(world, kind, answer)
    if before is not None:
        world.seen = _snapshot(world)
        problems += [f"a refusal changed {d}" for d in _diff(before, world.seen)]
    return [f"{route[0]} {route[1]} as {kind}: {p}" for p in problems]


def _served(live: LiveCluster) -> list[tuple[str, str]]:
    """Every (method, path) the controller's own OpenAPI document lists."""
    paths = live.ok("GET", "/openapi.json", ROOT)["paths"]
    methods = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    return [(m.upper(), path) for path, item in paths.items() for m in item if m in methods]


def test_every_route_answers_every_principal_as_documented(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory(
        {"h1": 4, "h2": 4}, controller=f'metrics_token = "{SCRAPE}"'
    )
    live.start()
    routes = _served(live)
    unclassified = [f"{m} {p}" for m, p in routes if (m, p) not in POLICY]
    assert not unclassified, (
        f"routes served but not classified: add each to POLICY (who may call it, as the "
        f"documents say) and to PROBES (how to call it): {unclassified}"
    )
    stale = sorted(set(POLICY) - set(routes))
    assert not stale, f"POLICY classifies routes the controller does not serve: {stale}"
    assert set(PROBES) == set(POLICY), set(PROBES) ^ set(POLICY)
    world = _world(live)
    problems: list[str] = []
    with world.client:
        for route in routes:
            world.seen = None
            # Refused principals first, on the target as set up; then the allowed.
            for kind in sorted(KINDS, key=lambda k: POLICY[route][k] == OK):
                try:
                    problems += _check(world, route, kind)
                except AssertionError as exc:  # the job broken by an earlier finding
                    problems.append(f"{route[0]} {route[1]} as {kind}: {exc}")
    assert not problems, "\n".join(problems)
    assert "Traceback" not in live.logs()
