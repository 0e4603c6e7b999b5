"""The live controller's parts in-process: configuration, the fenced store, submission
checks, the OpenAPI document against the served routes, and the resize hook driven
from many threads while the controller loop runs (real agents and tasks)."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.controllers.live.server import build_app
from xce_resize_plugin.controllers.live.submission import parse_submission
from xce_resize_plugin.core.models import GrowRequest, ReleaseRequest
from xce_resize_plugin.errors import ConfigError, FencedError, InvalidRequest, ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.testing.live import kill_marked, wait_until

GOOD = """
[controller]
listen = "127.0.0.1:7001"
state_dir = "state"
single_user = true

[cluster]
hosts = {{ h1 = 2, h2 = 2 }}

[users]
admins = ["root"]
tokens = {{ alice = "alice-secret-1", root = "sha256:{}" }}

[limits]
user_slots = {{ alice = 3 }}

[resize]
stop_grace = 1
""".format(hashlib.sha256(b"root-secret").hexdigest())


def _config(tmp_path: Path, text: str = GOOD) -> live_config.LiveConfig:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return live_config.load(path)


def test_config(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    assert cfg.state_dir == (tmp_path / "state").resolve()
    assert cfg.hosts == (("h1", 2), ("h2", 2))
    assert cfg.controller_url == "http://127.0.0.1:7001"
    assert cfg.user_slots == {"alice": 3} and cfg.admins == {"root"}
    assert [t.user for t in cfg.tokens if t.matches("root-secret")] == ["root"]
    assert [t.user for t in cfg.tokens if t.matches("alice-secret-1")] == ["alice"]
    assert not any(t.matches("alice-secret-2") for t in cfg.tokens)
    for bad, where in (
        (GOOD.replace("127.0.0.1:7001", "0.0.0.0:7001"), "controller.listen"),
        (GOOD.replace('"alice-secret-1"', '"short"'), "users.tokens.alice"),
        (GOOD.replace("stop_grace = 1", "stop_grac = 1"), "stop_grac"),
        (GOOD.replace("[limits]", "[limitz]"), "limitz"),
        (GOOD.replace('state_dir = "state"', ""), "controller.state_dir"),
        (GOOD.replace("h1 = 2", 'h1 = "2"'), "cluster.hosts.h1"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            _config(tmp_path, bad)


def test_config_names_its_first_mistake(tmp_path: Path) -> None:
    """Keys are checked in the order of the file's sections; the first bad one is named."""
    bad_url = GOOD.replace('state_dir = "state"', 'state_dir = "state"\nurl = "ftp://x"')
    bad_hosts = bad_url.replace("h1 = 2", 'h1 = "2"')
    bad_admins = bad_hosts.replace('admins = ["root"]', "admins = [1]")
    for text, where in (
        (bad_admins, "controller.url"),
        (bad_admins.replace('url = "ftp://x"', ""), "cluster.hosts.h1"),
        (bad_admins.replace('url = "ftp://x"', "").replace('h1 = "2"', "h1 = 2"), "users.admins"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "state"\nkill_grace = -1'), "kill_grace"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "s"\nrecord = ""'), "controller.record"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "s"\nmanage_workers = 1'), "manage"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            _config(tmp_path, text)
    cfg = _config(tmp_path, GOOD.replace('state_dir = "state"', 'state_dir = "s"\nrecord = "r"'))
    assert cfg.record == (tmp_path / "r").resolve() and cfg.manage_workers


def test_config_refuses_nonsense_naming_the_key(tmp_path: Path) -> None:
    """Not text, nested too deeply, NaN or infinite seconds, NUL in a path, a token of no
    user: each is one ConfigError naming the file and the key."""
    path = tmp_path / "c.toml"
    path.write_bytes(GOOD.encode() + b"# \xff\n")
    with pytest.raises(ConfigError, match=r"c\.toml: not UTF-8 text"):
        live_config.load(path)
    for text, where in (
        (GOOD + "x = " + "[" * 5000 + "]" * 5000 + "\n", "not valid TOML: nested too deeply"),
        (GOOD.replace("stop_grace = 1", "stop_grace = nan"), "stop_grace must be a finite"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "s"\nkill_grace = nan'), "kill_grace"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "s"\nworker_timeout = inf'), "worker"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "st\\u0000"'), "controller.state_dir"),
        (GOOD.replace('state_dir = "state"', 'state_dir = "s"\nrecord = "\\u0000"'), "record"),
        (GOOD.replace("alice = ", '"" = '), "users.tokens."),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            _config(tmp_path, text)


def test_config_request_deadlines(tmp_path: Path) -> None:
    """header_timeout, body_timeout and agent_timeout: 10 s, 30 s and 30 s unless given;
    a number of seconds above 0 and at most an hour, anything else named as the key's
    mistake."""
    cfg = _config(tmp_path)
    assert (cfg.header_timeout, cfg.body_timeout, cfg.agent_timeout) == (10.0, 30.0, 30.0)
    given = GOOD.replace(
        'state_dir = "state"',
        'state_dir = "state"\nheader_timeout = 2\nbody_timeout = 0.5\nagent_timeout = 4',
    )
    cfg = _config(tmp_path, given)
    assert (cfg.header_timeout, cfg.body_timeout, cfg.agent_timeout) == (2.0, 0.5, 4.0)
    for key in ("header_timeout", "body_timeout", "agent_timeout"):
        for value in ("0", "-1", "true", '"10"', "3601", "nan", "inf"):
            text = GOOD.replace('state_dir = "state"', f'state_dir = "state"\n{key} = {value}')
            with pytest.raises(
                ConfigError, match=rf"controller\.{key}: must be a number of seconds"
            ):
                _config(tmp_path, text)


def test_config_metrics_token(tmp_path: Path) -> None:
    """The scrape token: in clear or as its SHA-256, checked like a user's token, and
    never one of the users' tokens."""

    def with_token(value: str) -> str:
        return GOOD.replace('state_dir = "state"', f'state_dir = "state"\nmetrics_token = {value}')

    assert _config(tmp_path).metrics_token is None
    scrape = _config(tmp_path, with_token('"scrape-secret-1"')).metrics_token
    assert scrape is not None and scrape.matches("scrape-secret-1")
    assert not scrape.matches("scrape-secret-2") and not scrape.matches("alice-secret-1")
    digest = hashlib.sha256(b"scrape-secret-1").hexdigest()
    scrape = _config(tmp_path, with_token(f'"sha256:{digest}"')).metrics_token
    assert scrape is not None and scrape.matches("scrape-secret-1")
    for value, message in (
        ('"short"', "too short"),
        ("42", "must be a non-empty string"),
        ('"sha256:abc"', "64 hex digits"),
        ('"alice-secret-1"', "same token as user alice"),
        # The same token hashed, or in clear when a user's is hashed: still that user's.
        (f'"sha256:{hashlib.sha256(b"alice-secret-1").hexdigest().upper()}"', "user alice"),
        ('"root-secret"', "same token as user root"),
    ):
        with pytest.raises(ConfigError, match=rf"controller\.metrics_token.*{message}"):
            _config(tmp_path, with_token(value))
    # Two users given one token, once in clear and once hashed: refused as well.
    twice = GOOD.replace(
        'tokens = { alice = "alice-secret-1",',
        'tokens = { bob = "root-secret", alice = "alice-secret-1",',
    )
    with pytest.raises(ConfigError, match=r"users\.tokens\.root.*same token as user bob"):
        _config(tmp_path, twice)


def test_store_fencing(tmp_path: Path) -> None:
    """Two controllers on one state directory: the older one's writes fail. (The newer
    store is opened by another process, as it would be: LMDB allows one handle per
    environment and process.)"""
    first = LiveStore(tmp_path / "controller")
    first.put("job:1", {"argv": ["true"]})
    first.write({"clock": 1.0}, [])
    script = (
        "import sys; from pathlib import Path; "
        "from xce_resize_plugin.controllers.live.live_store import LiveStore; "
        "s = LiveStore(Path(sys.argv[1])); assert s.get('job:1') == {'argv': ['true']}; "
        "s.put('job:3', {'argv': ['x']}); s.write(None, []); print(s.epoch); s.close()"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "controller")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) == first.epoch + 1
    first.put("job:2", {"argv": ["false"]})
    with pytest.raises(FencedError, match="newer controller"):
        first.write(None, [])
    with pytest.raises(FencedError):
        first.check_epoch()
    first.close()
    again = LiveStore(tmp_path / "controller")
    assert again.get("job:2") is None and again.get("job:3") == {"argv": ["x"]}
    again.close()


def test_parse_submission() -> None:
    sub = parse_submission({"command": ["sleep", "1"], "tasks": "2,4", "ptile": 2})
    assert sub.tasks == (2, 4) and sub.ptile == 2 and sub.command == ("sleep", "1")
    assert parse_submission({"command": ["x"], "min_tasks": 2}).tasks == (2, 2)
    top = parse_submission({"command": ["x"], "tasks": "1,2147483647"}).tasks
    assert top == (1, 2**31 - 1)
    for body, field in (
        ({"command": "sleep 1"}, "$.command"),
        ({"command": []}, "$.command"),
        ({"command": ["x"], "tasks": 0}, "$.tasks"),
        ({"command": ["x"], "tasks": "4,2"}, "$.tasks"),
        # Counts no journal record can hold (2**64 failed the whole controller).
        ({"command": ["x"], "max_tasks": 2**64}, "$.max_tasks"),
        ({"command": ["x"], "max_tasks": 2**31}, "$.max_tasks"),
        ({"command": ["x"], "tasks": 2**31}, "$.tasks"),
        ({"command": ["x"], "tasks": "1,2147483648"}, "$.tasks"),
        ({"command": ["x"], "estimate": 10**400}, "$.estimate"),
        ({"command": ["x"], "estimate": 1e300}, "$.estimate"),
        ({"command": ["x"], "tasks": 2, "min_tasks": 1}, "$.tasks"),
        ({"command": ["x"], "grow_hosts": "some"}, "$.grow_hosts"),
        ({"command": ["x"], "env": {"A": 1}}, "$.env"),
        # Names a shell or `env` would show split, or that set another variable.
        ({"command": ["x"], "env": {"A\nB": "1"}}, "$.env"),
        ({"command": ["x"], "env": {"A B": "1"}}, "$.env"),
        ({"command": ["x"], "env": {"A=B": "1"}}, "$.env"),
        ({"command": ["x"], "env": {"A\x01": "1"}}, "$.env"),
        ({"command": ["x"], "env": {"": "1"}}, "$.env"),
        ({"command": ["x"], "cwd": "relative"}, "$.cwd"),
        ({"command": ["x"], "colour": "red"}, "$.colour"),
        ({"command": ["x"], "alloc": {"h1": "1"}}, "$.alloc"),
    ):
        with pytest.raises(InvalidRequest, match=field.replace("$", r"\$").replace(".", r"\.")):
            parse_submission(body)
    # Several bad fields: the first in the order of the Submission's fields is named.
    with pytest.raises(InvalidRequest, match=r"@ \$\.ptile"):
        parse_submission({"command": ["x"], "alloc": {}, "env": [], "ptile": "2"})
    sub = parse_submission(
        {"command": ["x"], "estimate": 5, "alloc": {"h1": 1}, "env": {"A": "b"}, "cwd": "/"}
    )
    assert sub.estimate == 5.0 and isinstance(sub.estimate, float)
    assert sub.alloc == (("h1", 1),) and sub.env == {"A": "b"} and sub.cwd == "/"


def test_openapi_matches_served_routes(tmp_path: Path) -> None:
    """Every served path and method is in /openapi.json and nothing else is."""
    cfg = _config(tmp_path)
    pm = get_plugin_manager(cfg.resize)
    ctl = LiveController(pm, cfg)
    try:
        app = build_app(ctl)
        from starlette.routing import Route

        served: set[tuple[str, str]] = set()
        for route in app.routes:
            assert isinstance(route, Route)
            served |= {(route.path, m.lower()) for m in (route.methods or ()) if m != "HEAD"}
        openapi = [r for r in app.routes if isinstance(r, Route) and r.path == "/openapi.json"]
        assert openapi
        import asyncio

        from starlette.requests import Request

        response = asyncio.run(
            openapi[0].endpoint(
                Request({"type": "http", "method": "GET", "path": "/", "headers": []})
            )
        )
        import json

        doc = json.loads(response.body)
        documented = {(p, m) for p, item in doc["paths"].items() for m in item}
        assert documented == served
        assert ("/v1/jobs/{id}/resize/grow", "post") in served  # the plugin's routes
        assert doc["openapi"].startswith("3.1")
        refs = json.dumps(doc)
        for name in doc["components"]["schemas"]:
            assert name  # every $ref below resolves to a schema
        for ref in {r.split('"')[0] for r in refs.split('"$ref": "#/components/schemas/')[1:]}:
            assert ref in doc["components"]["schemas"], ref
    finally:
        ctl.shutdown()


@contextlib.contextmanager
def _opened(tmp_path: Path) -> Iterator[tuple[pluggy.PluginManager, LiveController]]:
    """A controller of GOOD (alice may hold 8 slots), opened; shut down and its tasks
    killed after."""
    cfg = _config(tmp_path, GOOD.replace("alice = 3", "alice = 8"))
    pm = get_plugin_manager(cfg.resize)
    ctl = LiveController(pm, cfg)
    try:
        ctl.open()
        yield pm, ctl
    finally:
        ctl.shutdown()
        kill_marked(str(tmp_path))


def test_resize_hook_from_threads_while_the_loop_runs(tmp_path: Path) -> None:
    """Hook calls from request threads and the loop thread share the controller lock
    (no deadlock with the plugin's own lock); the invariants hold throughout."""
    with _opened(tmp_path) as (pm, ctl):
        alice = Principal("alice")
        job_id = ctl.submit_job(
            alice,
            {"command": ["sleep", "600"], "tasks": "1,4", "alloc": {"h1": 1}, "resizable": True},
        )["id"]
        wait_until(lambda: ctl.job_json(job_id)["tasks"][0]["pid"], 10, "task 0 running")
        errors: list[BaseException] = []
        outcomes: list[str] = []

        def client(n: int) -> None:
            for i in range(6):
                request: Any = GrowRequest(1, 1) if (n + i) % 2 == 0 else ReleaseRequest(count=1)
                try:
                    pm.hook.xce_resize_request(
                        controller=ctl, principal=alice, job_id=job_id, request=request
                    )
                    outcomes.append("ok")
                except ResizeError as exc:
                    outcomes.append(exc.code)  # in progress, pending, too small: fine
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                if ctl.check_invariants() != []:
                    errors.append(AssertionError(ctl.check_invariants()))

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert errors == []
        assert "ok" in outcomes

        def settled() -> bool:
            job = ctl.job_json(job_id)
            return bool(job["resize"] is None or job["resize"]["phase"] in ("IDLE", "GROW_PENDING"))

        wait_until(settled, 15, "no change in flight")
        job = ctl.job_json(job_id)
        assert ctl.check_invariants() == []
        running = [t for t in job["tasks"] if t["state"] == "RUNNING"]
        assert sorted(t["id"] for t in running) == sorted(t["id"] for t in job["allocation"])


def test_a_launch_or_notification_no_agent_can_be_sent_fails_where_it_is_made(
    tmp_path: Path,
) -> None:
    """A string no encoder takes (a lone surrogate), given through the Python API where
    no HTTP body is parsed, fails the job at its launch, with the reason, instead of
    ending the thread that sends the host's agent its commands (after which nothing on
    that host started or stopped again); a notification command the shell cannot be
    given is refused when asked for. The host serves the next job as before."""
    with _opened(tmp_path) as (pm, ctl):
        alice = Principal("alice")
        bad = ctl.submit_job(
            alice, {"command": ["sleep", "600"], "alloc": {"h1": 1}, "env": {"A": "\ud800"}}
        )["id"]
        wait_until(lambda: ctl.job_json(bad)["state"] == "EXIT", 15, "the unlaunchable job's end")
        job = ctl.job_json(bad)
        assert job["exit_reason"].startswith("task 0 failed to start: cannot be sent to the host")
        assert all(t["pid"] is None for t in job["tasks"])
        assert job["held"] == []  # no slot outlives it
        good = ctl.submit_job(
            alice,
            {"command": ["sleep", "600"], "tasks": "1,2", "alloc": {"h1": 1}, "resizable": True},
        )["id"]
        wait_until(lambda: ctl.job_json(good)["tasks"][0]["pid"], 10, "the next job on h1")
        for cmd, named in (("echo \ud800", "lone surrogate"), ("echo a\0b", "NUL")):
            with pytest.raises(InvalidRequest, match=named):
                pm.hook.xce_resize_request(
                    controller=ctl,
                    principal=alice,
                    job_id=good,
                    request=GrowRequest(1, 1, notify_cmd=cmd),
                )
        assert ctl.job_json(good)["resize"]["phase"] == "IDLE"
        ctl.kill_job(alice, good)
        wait_until(lambda: ctl.job_json(good)["state"] == "EXIT", 15, "the next job's end")
        assert ctl.check_invariants() == []
