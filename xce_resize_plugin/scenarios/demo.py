"""``xce-resize demo``: the built-in scenario (demo.toml beside this module)."""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path
from typing import TextIO

from xce_resize_plugin.scenarios import files as scenario_file
from xce_resize_plugin.scenarios import runner as scenario
from xce_resize_plugin.scenarios.timeline import render as render_timeline


def demo_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("demo.toml")))


def main(out: TextIO, *, as_json: bool = False) -> int:
    spec = scenario_file.load(demo_path())
    with tempfile.TemporaryDirectory(prefix="xce-resize-demo-") as tmp:
        result = scenario.run(spec, Path(tmp))
    if as_json:
        json.dump(result.to_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(render_timeline(result))
    return 0 if not result.problems else 1
