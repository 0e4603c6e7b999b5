"""docs/examples/xce-controller.service says what the controller does
(docs/live-controller.md, "As a service"): its command line parses, it stops only the
controller (the agents and the jobs' tasks outlive it), it is not restarted over a bad
configuration or a newer controller, and its descriptor limit is the one the controller
raises to. systemd itself is not on the test machines; what the unit relies on is
tested elsewhere (the agents and tasks outliving the controller: the failover tests)."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from xce_resize_plugin.cli.main import _parser
from xce_resize_plugin.controllers.live.fd_limits import MAX_NOFILE
from xce_resize_plugin.controllers.live.server import EXIT_FENCED, EXIT_USAGE

UNIT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "xce-controller.service"


def _service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    unit.read_string(UNIT.read_text())
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    return unit["Service"]


def test_the_units_command_line_is_the_controllers() -> None:
    argv = shlex.split(_service()["ExecStart"])
    assert Path(argv[0]).name == "xce-resize"
    args = _parser().parse_args(argv[1:])
    assert args.command == "controller" and str(args.config) == "/etc/xce/controller.toml"


def test_the_unit_stops_the_controller_only_and_never_restarts_over_a_newer_one() -> None:
    service = _service()
    assert service["KillMode"] == "process"  # the default would kill every running job
    assert service["Delegate"] == "yes"  # the agents' cgroups per task
    assert service["Restart"] == "on-failure"
    refused = {int(code) for code in service["RestartPreventExitStatus"].split()}
    assert refused == {EXIT_USAGE, EXIT_FENCED}
    assert int(service["LimitNOFILE"]) == MAX_NOFILE


def test_the_guide_shows_the_unit() -> None:
    guide = (UNIT.parents[1] / "live-controller.md").read_text()
    assert "examples/xce-controller.service" in guide and "KillMode=process" in guide
