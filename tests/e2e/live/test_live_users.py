"""Who a job runs as (docs/live-controller.md, "Who runs a job"): a controller that runs
as root runs every task and notification command as the job's owner (uid, gid, groups)
and refuses an owner without a local account; one that does not refuses other users'
jobs unless ``[controller] single_user = true``.

The decision is tested wherever the tests run (:func:`job_account` takes the user the
controller runs as); the real processes need root, and use accounts the machine has."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.proc import Account, run_as_options
from xce_resize_plugin.controllers.live.submission import SubmitRejected, check_cwd, job_account
from xce_resize_plugin.errors import ConfigError, InvalidRequest
from xce_resize_plugin.testing.live import ALICE, ROOT, LiveCluster, wait_until

#: A user name no machine has.
NOBODY_HERE = "xce-no-such-user"
NOBODY_TOKEN = "no-such-user-token"
OWNER_TOKEN = "local-owner-token-1"
#: Writes who it runs as, what it can reach, then waits (task 0 only writes).
WHOAMI = (
    'if [ "$XCE_TASK_ID" = 0 ]; then {{ id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; '
    'pwd; cat "$XCE_HOSTFILE" | tr "\\n" " "; echo; '
    'cat "{state}/workers/secret" >/dev/null 2>&1; echo "secret $?"; '
    'ls "{state}/controller" >/dev/null 2>&1; echo "store $?"; }} > "{out}"; fi; '
    "exec sleep 600"
)
NOTIFY = 'echo "$(id -u) $(id -g) $(id -G) $HOME"'


def _local_account() -> Account:
    """An account of this machine other than root, one with supplementary groups if
    there is one (so that the groups are seen to be set, not just the primary one)."""
    others = [e for e in pwd.getpwall() if e.pw_uid != 0]
    assert others, "this machine has no account but root"
    assert not any(e.pw_name == NOBODY_HERE for e in others)
    rich = [e for e in others if len(os.getgrouplist(e.pw_name, e.pw_gid)) > 1]
    return Account.named((rich or others)[0].pw_name)


# -- the decision, wherever the tests run -------------------------------------------


def test_root_runs_a_job_as_its_owner_and_refuses_an_unknown_owner() -> None:
    account = _local_account()
    entry = pwd.getpwnam(account.name)
    got = job_account(account.name, single_user=False, euid=0)
    assert (got.uid, got.gid, got.home) == (entry.pw_uid, entry.pw_gid, entry.pw_dir)
    assert got.groups == tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    with pytest.raises(SubmitRejected, match=f"user {NOBODY_HERE} has no local account") as exc:
        job_account(NOBODY_HERE, single_user=False, euid=0)
    assert exc.value.code == "XCE_SUBMIT_REJECTED" and exc.value.http_status == 400
    # What to do about it, in the same line.
    assert "create the account; or" in str(exc.value)
    assert "set [controller] single_user = true" in str(exc.value)


def test_a_controller_that_is_not_root_runs_only_its_users_jobs() -> None:
    account = _local_account()
    assert job_account(account.name, single_user=False, euid=account.uid).uid == account.uid
    with pytest.raises(SubmitRejected, match=r"not root: it runs only .*single_user = true"):
        job_account("root", single_user=False, euid=account.uid)
    # A personal controller runs everybody's jobs as its own user.
    for owner in ("root", NOBODY_HERE):
        assert job_account(owner, single_user=True, euid=account.uid).uid == account.uid
        assert job_account(owner, single_user=True, euid=0).uid == 0


def test_root_never_tells_a_user_whether_a_path_exists(tmp_path: Path) -> None:
    """A working directory is looked up at submission only by a controller that runs
    as the job's user: root answering "no such directory" for another user's job would
    tell whether a path exists where that user may not look."""
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    owner, me = _local_account(), Account.of_uid(os.geteuid())
    missing, present = str(hidden / "nope"), str(hidden)
    check_cwd(missing, owner, euid=0)  # as root, for another user: no look, no answer
    check_cwd(present, owner, euid=0)
    check_cwd(present, me, euid=me.uid)
    with pytest.raises(InvalidRequest, match=r"no such directory .*nope @ \$\.cwd"):
        check_cwd(missing, me, euid=me.uid)  # its own user: it could look itself
    check_cwd(None, me, euid=me.uid)


def test_single_user_is_a_checked_setting(tmp_path: Path) -> None:
    base = '[controller]\nstate_dir = "s"\n{}\n[cluster]\nhosts = {{ h1 = 1 }}\n'
    path = tmp_path / "c.toml"
    path.write_text(base.format(""))
    assert live_config.load(path).single_user is False
    path.write_text(base.format("single_user = true"))
    assert live_config.load(path).single_user is True
    path.write_text(base.format('single_user = "yes"'))
    with pytest.raises(ConfigError, match=r"controller\.single_user: must be true or false"):
        live_config.load(path)


# -- real processes (root) --------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="running processes as other users needs root"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's own are private to the test's user):
    a controller that runs jobs as their owners refuses a state directory they cannot."""
    path = Path(tempfile.mkdtemp(prefix="xce-users-", dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _cluster(base: Path, account: Account) -> LiveCluster:
    """A live cluster in ``base`` that runs jobs as their owners; ``account``'s user and
    one without a local account have tokens."""
    tokens = {account.name: OWNER_TOKEN, NOBODY_HERE: NOBODY_TOKEN}
    return LiveCluster(base, {"h1": 2}, {"notify_timeout": 10}, single_user=False, tokens=tokens)


def _work_dir(base: Path, account: Account) -> Path:
    work = base / "work"
    work.mkdir()
    os.chown(work, account.uid, account.gid)
    os.chmod(work, 0o700)
    return work


def _ids(uid: str, gid: str, groups: str) -> tuple[int, int, set[int]]:
    """``id -u``, ``id -g`` and ``id -G`` as numbers (the groups in no set order)."""
    return int(uid), int(gid), {int(g) for g in groups.split()}


def _ended(live: LiveCluster, job_id: str) -> dict[str, Any]:
    return dict(wait_until(lambda: (j := live.job(job_id))["state"] != "RUN" and j, 15, "end"))


@needs_root
def test_tasks_and_notifications_run_as_the_owner(shared_dir: Path) -> None:
    account = _local_account()
    live = _cluster(shared_dir, account)
    work = _work_dir(shared_dir, account)
    out = work / "who"
    try:
        live.start()
        refused = live.call("POST", "/v1/jobs", NOBODY_TOKEN, {"command": ["true"]})
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "XCE_SUBMIT_REJECTED"
        assert f"user {NOBODY_HERE} has no local account" in refused.json()["detail"]
        assert live.ok("GET", "/v1/jobs", ROOT) == {"jobs": []}  # nothing was submitted

        command = ["/bin/sh", "-c", WHOAMI.format(state=live.state, out=out)]
        job_id = live.submit(
            OWNER_TOKEN,
            command=command,
            tasks="1,2",
            resizable=True,
            cwd=str(work),
            notify_cmd=NOTIFY,
            alloc={"h1": 1},
        )
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == 8, 15, "who")
        lines = out.read_text().splitlines()
        assert _ids(*lines[0:3]) == (account.uid, account.gid, set(account.groups)), lines
        assert lines[3] == f"{account.home} {account.name} {account.name}"
        assert lines[4] == str(work) and lines[5].split() == ["h1"]  # the hostfile
        # The controller's secret and stores: out of its reach (cat and ls fail).
        assert lines[6].startswith("secret ") and lines[6] != "secret 0", lines[6]
        assert lines[7].startswith("store ") and lines[7] != "store 0", lines[7]

        # Its log files and directory: the owner's to read, nobody else's.
        jdir = live.state / "jobs" / job_id
        log = (jdir / "task-0.out").stat()
        assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (account.uid, 0o600)
        info = jdir.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o711)

        # A notification command runs as the owner too.
        assert live.grow(job_id, 1, token=OWNER_TOKEN).status_code == 202
        note = live.idle(job_id, 1)["notifications"][0]
        uid, gid, *groups, home = note["stdout"].split()
        assert _ids(uid, gid, " ".join(groups)) == (account.uid, account.gid, set(account.groups))
        assert home == account.home, note
        notify_log = (jdir / "notify-1.log").stat()
        assert (notify_log.st_uid, stat.S_IMODE(notify_log.st_mode)) == (account.uid, 0o600)
    finally:
        live.cleanup()


def _sharing_accounts() -> tuple[Account, Account]:
    """Two local accounts of one primary group (``nobody`` and ``sync`` on Debian, both
    of ``nogroup``; ``users``, gid 100, where accounts share it): the job's owner, and
    another user of its group."""
    try:
        owner = Account.of_uid(pwd.getpwnam("nobody").pw_uid)
    except KeyError:
        pytest.skip("this machine has no account nobody")
    sharers = [
        e for e in pwd.getpwall() if e.pw_gid == owner.gid and e.pw_uid not in (0, owner.uid)
    ]
    if not sharers:
        pytest.skip(f"no account but nobody has primary group {owner.gid} here")
    return owner, Account.named(sharers[0].pw_name)


def _as(account: Account, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``account`` (its uid, gid and groups, as an agent runs a task),
    its output captured."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, check=False, **run_as_options(account)
    )


#: Task 0 copies its hostfile and task file where the test reads them, then waits.
READ_OWN = (
    'if [ "$XCE_TASK_ID" = 0 ]; then cat "$XCE_HOSTFILE" "$XCE_TASKFILE" > "{out}.new"; '
    'mv "{out}.new" "{out}"; fi; exec sleep 600'
)


@needs_root
def test_a_user_of_the_owners_group_reads_nothing_of_the_job(shared_dir: Path) -> None:
    """Users who share a primary group (``users``) do not see each other's jobs: the
    job's directory is root's, 0711 (passed through, not listed), and the files the
    job reads are its owner's, 0400 (docs/live-controller.md, "State directory"). The
    job itself still reads them, by the names its environment gives."""
    owner, sharer = _sharing_accounts()
    live = _cluster(shared_dir, owner)
    work = _work_dir(shared_dir, owner)
    out = work / "read"
    try:
        live.start()
        job_id = live.submit(
            OWNER_TOKEN,
            command=["/bin/sh", "-c", READ_OWN.format(out=out)],
            cwd=str(work),
            tasks="1,2",
            resizable=True,
            notify_cmd='cat "$XCE_HOSTFILE"',
            alloc={"h1": 1},
        )
        wait_until(out.exists, 15, "the task read its files")
        assert out.read_text() == "h1\n0 h1\n"  # as nobody, from its own job's directory
        assert live.grow(job_id, 1, token=OWNER_TOKEN).status_code == 202
        note = live.idle(job_id, 1)["notifications"][0]
        assert note["status"] == 0 and note["stdout"] == "h1\nh1\n", note  # hostfile.v1

        jdir = live.state / "jobs" / job_id
        files = [jdir / name for name in ("hostfile", "tasks", "hostfile.v1")]
        listing = _as(sharer, "ls", str(jdir))
        assert listing.returncode != 0 and "Permission denied" in listing.stderr, listing
        for path in files:
            read = _as(sharer, "cat", str(path))
            assert read.returncode != 0 and "Permission denied" in read.stderr, read
        assert _as(owner, "cat", str(jdir / "hostfile")).stdout == "h1\nh1\n"
        info = jdir.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o711)
        for path in files:
            info = path.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (owner.uid, 0o400), path
    finally:
        live.cleanup()


@needs_root
def test_a_task_enters_its_directory_as_its_owner(shared_dir: Path) -> None:
    """The working directory is entered as the owner: one only root may enter ends the
    task (status 126); without ``cwd`` a task starts in its owner's home."""
    account = _local_account()
    live = _cluster(shared_dir, account)
    private = shared_dir / "root-only"
    private.mkdir(mode=0o700)
    work = _work_dir(shared_dir, account)
    try:
        live.start()
        job = _ended(live, live.submit(OWNER_TOKEN, command=["/bin/true"], cwd=str(private)))
        assert job["state"] == "EXIT" and job["tasks"][0]["status"] == 126, job
        script = f'pwd > "{work}/cwd"'
        job = _ended(live, live.submit(OWNER_TOKEN, command=["/bin/sh", "-c", script]))
        if os.path.isdir(account.home):
            assert job["state"] == "DONE" and (work / "cwd").read_text().strip() == account.home
        else:  # an account whose home does not exist (nobody's is /nonexistent)
            assert job["state"] == "EXIT" and job["tasks"][0]["status"] == 126, job
    finally:
        live.cleanup()


@needs_root
def test_a_controller_that_is_not_root_refuses_other_users_jobs(shared_dir: Path) -> None:
    """The controller (and so its agents) runs as a local account: its own jobs run,
    as it; another user's job is refused, since it could only run as the controller."""
    account = _local_account()
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import xce_resize_plugin"], user=account.uid, check=False
        )
    except PermissionError:
        pytest.skip(f"{account.name} cannot run {sys.executable}")
    if probe.returncode != 0:
        pytest.skip(f"{account.name} cannot import the package with {sys.executable}")
    live = _cluster(shared_dir, account)
    os.chown(shared_dir, account.uid, account.gid)
    work = _work_dir(shared_dir, account)
    try:
        live.start(user=account.uid)
        refused = live.call("POST", "/v1/jobs", ALICE, {"command": ["true"]})
        assert refused.status_code == 400 and refused.json()["code"] == "XCE_SUBMIT_REJECTED"
        assert "single_user = true" in refused.json()["detail"]
        job = _ended(
            live, live.submit(OWNER_TOKEN, command=["/bin/sh", "-c", f'id -u > "{work}/uid"'])
        )
        assert job["state"] == "DONE", job
        assert (work / "uid").read_text().strip() == str(account.uid)
    finally:
        live.cleanup()


def test_max_pend_jobs_is_a_checked_setting(tmp_path: Path) -> None:
    base = '[controller]\nstate_dir = "s"\n[cluster]\nhosts = { h1 = 1 }\n{}'
    path = tmp_path / "c.toml"
    path.write_text(base.replace("{}", ""))
    assert live_config.load(path).max_pend_jobs == 10_000
    path.write_text(base.replace("{}", "[limits]\nmax_pend_jobs = 0\n"))
    assert live_config.load(path).max_pend_jobs == 0
    for bad in ("-1", "true", "2.5", '"10"'):
        path.write_text(base.replace("{}", f"[limits]\nmax_pend_jobs = {bad}\n"))
        with pytest.raises(ConfigError, match=r"limits\.max_pend_jobs: must be an integer >= 0"):
            live_config.load(path)
