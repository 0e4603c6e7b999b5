"""Whom the controller sends its agent secret to: only the process that registered the
port (docs/live-controller.md, "Agents"). A job that took the loopback port of an agent
that crashed was sent the secret, and could then have an agent run anything as root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live.proc import listens_on
from xce_resize_plugin.controllers.live.worker import WorkerAgent
from xce_resize_plugin.controllers.live.worker_server import _only_agent

linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")

#: A process that listens on a loopback port, prints it, and waits.
_LISTENER = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
)


@linux_only
def test_a_port_is_the_registered_process_only_when_that_process_listens() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as other:
        try:
            assert other.stdout is not None
            their_port = int(other.stdout.readline())
            with socket.socket() as mine:
                mine.bind(("127.0.0.1", 0))
                mine.listen(1)
                my_port = mine.getsockname()[1]
                assert listens_on(other.pid, their_port) is True
                assert listens_on(os.getpid(), my_port) is True
                # A registration naming one process and another's port is not believed.
                assert listens_on(os.getpid(), their_port) is False
                assert listens_on(other.pid, my_port) is False
            # Nobody listens there any more.
            assert listens_on(os.getpid(), my_port) is False
        finally:
            other.kill()  # by the pid this test started
            other.wait()
    # A process that is gone listens nowhere.
    assert listens_on(other.pid, their_port) is False


def test_an_agent_taking_the_lock_removes_a_crashed_agents_registration(
    tmp_path: Path,
) -> None:
    """Until the new agent writes its own, the old file named a port anyone may hold."""
    agent = WorkerAgent("h1", tmp_path)
    agent.dir.mkdir(parents=True)
    (agent.dir / "worker.json").write_text(json.dumps({"pid": 1, "port": 1, "host": "h1"}))
    lock = _only_agent(agent)
    assert lock is not None
    try:
        assert not (agent.dir / "worker.json").exists()
    finally:
        lock.release()


@linux_only
def test_commands_go_only_to_the_registered_agents_socket(tmp_path: Path) -> None:
    """A launch carries the job's token in its environment: sent to whatever held the
    agent's port once the agent had died (before the poll thread noticed), it gave the
    job's token away. The commands wait for the agent's successor instead."""
    from types import SimpleNamespace

    from tests.http_stub import answering
    from xce_resize_plugin.controllers.live.tasks import WorkerChannel

    fleet = SimpleNamespace(
        state_dir=tmp_path, secret="s3cr3t", owner=object(), closed=False, epoch=1
    )
    channel = WorkerChannel(fleet, "h1")  # type: ignore[arg-type]
    with answering(b'{"ok": true, "seq": 1}') as squatter:
        channel.port = int(squatter.url.rsplit(":", 1)[1])
        # The agent connect() saw on this port, gone since.
        channel.pid = os.getpid() + 1_000_000
        channel._verified = (channel.pid, 1)
        channel.instance, channel.ready = "i", True
        launch = {"op": "launch", "job": "7", "task": 1, "env": {"XCE_JOB_TOKEN": "7.tok"}}
        with channel._client(5.0) as client:
            channel._post(client, [launch])
        assert squatter.seen == []
    assert channel.ready is False and channel.queued() == {("launch", "7", 1)}
