"""What bounds the key-value store on the live controller for one user, with a real
controller over real HTTP (docs/in-job-api.md, "Key-value store"): only a job that
has started takes writes, the values of all of a user's jobs share ``[limits]
kv_bytes_per_user`` (counted as stored, and again after a restart), and a user has
at most four key-value writes in progress at once."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.job_kv import MAX_WRITES_IN_PROGRESS, record_key
from xce_resize_plugin.controllers.live.live_store import LiveStore, kv_stored_size
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.testing.live import ALICE, BOB, LiveCluster, wait_until

#: Small enough to reach with a few short values.
LIMIT = 300


def _refused(answer: Any, status: int, code: str) -> str:
    """The problem's detail, once its status and code are checked."""
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == code, answer.text
    return str(answer.json()["detail"])


def test_a_pending_job_takes_no_writes(resize_live_factory: Any) -> None:
    """A job that waits for slots has no task to read a value: a write is refused
    409 ``LSBE_NOT_STARTED`` and stores nothing (one user's thousands of pending jobs
    filled the controller's memory and disk this way); a read answers as for a running
    job's key not set. Once the job runs, writes are taken."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    live.start()
    first = live.submit()
    live.running(first, 1)
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    job_id, token = answer["id"], answer["token"]
    assert live.job(job_id)["state"] == "PEND"
    kv = f"/v1/jobs/{job_id}/kv"
    for who in (ALICE, token):
        detail = _refused(live.call("PUT", f"{kv}/k", who, {"value": "v"}), 409, "LSBE_NOT_STARTED")
        assert job_id in detail and "PEND" in detail
        _refused(live.call("DELETE", f"{kv}/k", who), 404, "XCE_KV_NO_KEY")  # none to remove
    start = time.monotonic()
    _refused(live.call("GET", f"{kv}/k?wait=1", token), 404, "XCE_KV_NO_KEY")
    assert time.monotonic() - start >= 0.9  # a waiting read waited
    assert live.call("DELETE", f"/v1/jobs/{first}", ALICE).status_code == 202
    live.running(job_id, 1)
    _refused(live.call("GET", f"{kv}/k", token), 404, "XCE_KV_NO_KEY")  # nothing was kept
    assert live.ok("PUT", f"{kv}/k", token, {"value": "v"})["version"] == 1


def test_a_users_jobs_share_a_bound_on_stored_bytes(resize_live_factory: Any) -> None:
    """``[limits] kv_bytes_per_user`` across two jobs of one user, counted as the store
    keeps a value (JSON-escaped: 6 bytes for a control character): a write beyond is
    refused 413 ``XCE_KV_LIMIT`` naming the limit and changes nothing; replacing a value
    counts the difference; a delete and a job's end make room; another user has their
    own bound; the count is the same after a kill -9 and restart of the controller."""
    live: LiveCluster = resize_live_factory(
        {"h1": 2, "h2": 1}, limits=f"[limits]\nkv_bytes_per_user = {LIMIT}"
    )
    live.start()
    one, two = (live.submit(alloc={"h1": 1}) for _ in range(2))
    bobs = live.submit(BOB, alloc={"h2": 1})
    for job_id in (one, two, bobs):
        live.running(job_id, 1)

    def put(job_id: str, key: str, value: str, token: str = ALICE) -> Any:
        return live.call("PUT", f"/v1/jobs/{job_id}/kv/{key}", token, {"value": value})

    def value(job_id: str, key: str) -> Any:
        return live.call("GET", f"/v1/jobs/{job_id}/kv/{key}", ALICE).json().get("value")

    assert put(one, "a", "a" * 150).status_code == 200  # 152 bytes stored
    assert put(two, "c", "\x01" * 20).status_code == 200  # 122 bytes stored, 274 in all
    detail = _refused(put(two, "b", "b" * 30), 413, "XCE_KV_LIMIT")  # 32 more: 306
    assert f"kv_bytes_per_user = {LIMIT}" in detail and "alice" in detail, detail
    assert value(two, "b") is None
    _refused(put(one, "a", "a" * 178), 413, "XCE_KV_LIMIT")  # 28 more than its 152
    assert live.ok("GET", f"/v1/jobs/{one}/kv/a")["version"] == 1
    assert value(one, "a") == "a" * 150
    assert put(bobs, "x", "x" * 250, BOB).status_code == 200  # bob's own bound
    assert live.ok("DELETE", f"/v1/jobs/{two}/kv/c")["version"] == 1  # 152 left
    assert put(two, "b", "b" * 30).status_code == 200  # 184

    live.crash()
    live.start()
    _refused(put(two, "y", "y" * 120), 413, "XCE_KV_LIMIT")  # 122 more: 306
    assert put(two, "y", "y" * 114).status_code == 200  # 116 more: 300, the limit
    _refused(put(one, "z", ""), 413, "XCE_KV_LIMIT")  # even "" is 2 bytes stored
    assert live.call("DELETE", f"/v1/jobs/{two}", ALICE).status_code == 202
    wait_until(lambda: live.job(two)["state"] == "EXIT", 15, "job end")
    assert put(one, "z", "z" * 146).status_code == 200  # 152 + 148 = 300


def _slow_put(live: LiveCluster, job_id: str, key: str) -> tuple[socket.socket, bytes]:
    """A ``PUT`` whose headers and first body bytes are sent, the rest (returned) not
    yet: the controller serves it, waiting for its body, until the rest is sent."""
    body = b'{"value": "slow"}'
    head = (
        f"PUT /v1/jobs/{job_id}/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=20)
    sock.sendall(head + body[:4])
    return sock, body[4:]


def test_a_users_writes_in_progress_are_bounded(resize_live_factory: Any) -> None:
    """Four of alice's key-value writes in progress (their bodies held back): her next
    ``PUT`` and ``DELETE`` are refused 429 ``XCE_TOO_MANY_REQUESTS`` with
    ``Retry-After: 1`` and change nothing, while her reads and bob's writes are served;
    once the four are answered her writes are taken again. Without the bound one user's
    hundreds of concurrent writes queued on the controller's lock, each with its
    fsync, ahead of every other user's requests."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    mine, bobs = live.submit(), live.submit(BOB)
    live.running(mine, 1)
    live.running(bobs, 1)
    kv = f"/v1/jobs/{mine}/kv"
    live.ok("PUT", f"{kv}/kept", ALICE, {"value": "v"})
    held = [_slow_put(live, mine, f"slow{i}") for i in range(MAX_WRITES_IN_PROGRESS)]
    try:
        # Each write above is counted once the controller reads its headers: a probe
        # is taken (and stored) until then, refused from then on.
        answer = wait_until(
            lambda: (
                (r := live.call("PUT", f"{kv}/probe", ALICE, {"value": "p"})).status_code == 429
                and r
            ),
            10,
            "a write refused",
        )
        detail = _refused(answer, 429, "XCE_TOO_MANY_REQUESTS")
        assert answer.headers["Retry-After"] == "1"
        assert f"at most {MAX_WRITES_IN_PROGRESS}" in detail and "alice" in detail, detail
        _refused(live.call("DELETE", f"{kv}/kept", ALICE), 429, "XCE_TOO_MANY_REQUESTS")
        assert live.ok("GET", f"{kv}/kept", ALICE)["version"] == 1  # reads are not bounded
        assert live.ok("PUT", f"/v1/jobs/{bobs}/kv/k", BOB, {"value": "b"})["version"] == 1
        for sock, rest in held:
            sock.sendall(rest)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 "), "a held write refused"
    finally:
        for sock, _ in held:
            sock.close()
    assert live.ok("GET", f"{kv}/slow0", ALICE)["value"] == "slow"
    assert live.ok("DELETE", f"{kv}/kept", ALICE)["version"] == 1


def test_the_stores_count_follows_its_records_and_a_reload(tmp_path: Path) -> None:
    """The per-job count of stored bytes that the bound reads: as the side records
    change (a replaced value counts the difference, a deleted one frees its bytes),
    read again from the records when the store opens, and after a failed write, when
    the controller reloads what is on disk, it counts what is on disk only."""
    value = "\x01é\U0001f600\n" + "a" * 10
    # Quotes, \u0001, \u00e9, a surrogate pair, \n, ten letters: not its 18 UTF-8 bytes.
    assert kv_stored_size(value) == 2 + 6 + 6 + 12 + 2 + 10
    store = LiveStore(tmp_path / "controller")
    try:
        store.put(record_key("101", "a"), {"value": value, "version": 1})
        store.put(record_key("101", "b"), {"value": "bb", "version": 1})
        store.put(record_key("1:2", "a"), {"value": "", "version": 1})
        store.write(None, [])
        assert store.kv_bytes == {"101": kv_stored_size(value) + 4, "1:2": 2}
        store.put(record_key("101", "b"), {"value": "b" * 10, "version": 2})
        store.put(record_key("1:2", "a"), None)
        assert store.kv_bytes == {"101": kv_stored_size(value) + 12}
        store.reload()  # the two changes above were never written
        assert store.kv_bytes == {"101": kv_stored_size(value) + 4, "1:2": 2}
        store.put(record_key("101", "a"), None)
        store.put(record_key("101", "b"), None)
        store.write(None, [])
    finally:
        store.close()
    store = LiveStore(tmp_path / "controller")
    try:
        assert store.kv_bytes == {"1:2": 2}
    finally:
        store.close()


def test_the_bound_is_a_checked_setting(tmp_path: Path) -> None:
    """``[limits] kv_bytes_per_user``: 64 MiB unless set; from 1 to 1 TiB, else the
    controller does not start, the key named."""
    path = tmp_path / "c.toml"
    base = '[controller]\nstate_dir = "s"\n[cluster]\nhosts = { h1 = 1 }\n'
    path.write_text(base)
    assert live_config.load(path).kv_bytes_per_user == 64 * 1024 * 1024
    path.write_text(base + "[limits]\nkv_bytes_per_user = 4096\n")
    assert live_config.load(path).kv_bytes_per_user == 4096
    for bad in ("0", "-1", "true", '"1"', "1.5", str((1 << 40) + 1)):
        path.write_text(base + f"[limits]\nkv_bytes_per_user = {bad}\n")
        with pytest.raises(ConfigError, match=r"limits\.kv_bytes_per_user: must be an integer"):
            live_config.load(path)


def test_values_an_earlier_version_took_for_a_pending_job_can_go(
    resize_live_factory: Any,
) -> None:
    """An earlier version took values for pending jobs: they count among the owner's
    bytes, a DELETE removes them, and a kill of the job removes the rest, as any job's
    end does (they held the owner's bytes until the job was dropped)."""
    live: LiveCluster = resize_live_factory({"h1": 1}, limits="[limits]\nkv_bytes_per_user = 300")
    live.start()
    running = live.submit()
    live.running(running, 1)
    pend = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})["id"]
    assert live.job(pend)["state"] == "PEND"
    live.crash()
    store = LiveStore(live.state / "controller")  # as an earlier version left it
    try:
        spec = dict(store.get(f"job:{pend}"))
        spec["kv"] = ["old", "older"]
        store.put(f"job:{pend}", spec)
        store.put(record_key(pend, "old"), {"value": "o" * 120, "version": 1})
        store.put(record_key(pend, "older"), {"value": "o" * 120, "version": 1})
        store.write(None, [])
    finally:
        store.close()
    live.start()
    kv = f"/v1/jobs/{running}/kv"
    _refused(live.call("PUT", f"{kv}/a", ALICE, {"value": "a" * 100}), 413, "XCE_KV_LIMIT")
    assert live.ok("DELETE", f"/v1/jobs/{pend}/kv/old", ALICE)["version"] == 1
    assert live.ok("PUT", f"{kv}/a", ALICE, {"value": "a" * 100})["version"] == 1
    _refused(live.call("PUT", f"{kv}/b", ALICE, {"value": "b" * 100}), 413, "XCE_KV_LIMIT")
    assert live.call("DELETE", f"/v1/jobs/{pend}", ALICE).status_code == 202
    wait_until(lambda: live.job(pend)["state"] == "EXIT", 10, "the kill")
    assert live.ok("PUT", f"{kv}/b", ALICE, {"value": "b" * 100})["version"] == 1
    gone = live.call("GET", f"/v1/jobs/{pend}/kv/older", ALICE)
    _refused(gone, 409, "LSBE_JOB_FINISH")
