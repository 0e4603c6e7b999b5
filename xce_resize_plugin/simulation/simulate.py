"""Trace simulation: the same workload twice, all rigid and with a malleable share.

``xce-resize simulate TRACE`` (and :func:`simulate`) reads a real workload trace
(:mod:`.traces`), converts the chosen share of its jobs to malleable (:mod:`.malleable`)
and runs it twice through the embedded controller **with the resize plugin, its hooks
and its journal in the loop**:

- the *rigid* run (the baseline): every job at its recorded size, FCFS + EASY backfill;
- the *elastic* run: the malleable jobs are submitted resizable (``-n min,max``,
  started at their recorded size, or smaller down to ``min`` when that is what fits)
  with a work-based run time (:mod:`.work`), and a driver (:mod:`.drivers`) asks the
  plugin for grows and shrinks as an application or a site would.

The cluster (:func:`cluster_for`): the trace's ``MaxProcs`` (else its largest job)
slots, on hosts of ``slots_per_host`` slots each (default 1: SWF counts processors,
not nodes, and jobs carry no span rules, so one slot per host loses nothing and keeps
every placement exact). The scheduler plans with the user's requested time
(the run time when the trace has none).

Both runs are checked as they go (:mod:`.checks`) and measured (:mod:`.metrics`). The
result (:class:`Comparison`) is deterministic: the same trace, options and seed give
byte-identical JSON (:meth:`Comparison.to_json`), whether the runs went one after the
other or side by side in two processes (the default on a machine with two cores or
more: the runs are independent).

Speed: the controller runs with ``store="none"`` (no state of its own saved; nothing
to restart from in a simulation), ``keep_finished=False``, ``lean_cycles``, and the
plugin's journal with ``journal_sync = false`` (written to LMDB, not fsynced) and
``journal_defer`` (transitions the host has not acted on go with the next write): the
journal stays in the loop with every fact in order, a year of trace is just not bound
by fsyncs and transaction counts.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

import attrs
from attrs import frozen

from xce_resize_plugin.controllers.runners import (
    NotificationRunner,
    ScriptedNotificationRunner,
    SimTaskRunner,
    TaskRunner,
)
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.sim.work import SpeedupWork
from xce_resize_plugin.controllers.tomlfile import read_toml
from xce_resize_plugin.core import config as config_mod
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.recording.format import RecordingWriter
from xce_resize_plugin.recording.sim_recorder import SimRecorder
from xce_resize_plugin.simulation import failures as failures_mod
from xce_resize_plugin.simulation.checks import (
    CompletionCheck,
    EasyCheck,
    LedgerCheck,
    WorkCheck,
    check_utilization,
)
from xce_resize_plugin.simulation.drivers import DRIVERS, Driver, MalleableSpec, make_driver
from xce_resize_plugin.simulation.failures import FailureInjector, FailureStats, HostFailures
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.jobs_csv import JobRow, JobRows
from xce_resize_plugin.simulation.malleable import (
    MalleableRule,
    SimJob,
    SpeedupModel,
    convert,
    parse_speedup,
)
from xce_resize_plugin.simulation.metrics import RunMetrics, RunStats
from xce_resize_plugin.simulation.run_log import LogSummary, LogTally, tally_warnings
from xce_resize_plugin.simulation.traces import Trace, read_trace

__all__ = [
    "Gathered",
    "Mode",
    "RunParts",
    "RunResult",
    "SimOptions",
    "SimulationError",
    "Workload",
    "cluster_for",
    "gather_run",
    "host_count",
    "load_workload",
    "machine_procs",
    "options_from_tables",
    "read_toml",
    "result_of",
    "run_mode",
    "workload_of",
]

Mode = Literal["rigid", "elastic"]
MODES: tuple[Mode, Mode] = ("rigid", "elastic")
#: Points of the utilization-over-time series in the JSON output and the plot.
USAGE_BINS = 200
FORMAT = "xce-resize-simulate"
#: Journal entries a simulation writes per transaction (``[resize] journal_batch``).
SIM_BATCH = 1024
FORMAT_VERSION = 1

ProgressFn = Callable[[str, int, int], None]


class SimulationError(ConfigError):
    """A simulation could not run (a worker process failed, a bad workload)."""

    message = "Simulation failed"


def _sim_resize(resize: Mapping[str, Any]) -> dict[str, Any]:
    """The simulations' ``[resize]`` defaults under the user's section."""
    out = {"journal_sync": False, **dict(resize)}
    out.setdefault("journal_defer", out["journal_sync"] is False)
    if out["journal_defer"] is True:
        # A simulation is never resumed (its controller keeps no store): every
        # transition may wait, and the journal is written SIM_BATCH entries at a time.
        out.setdefault("journal_batch", SIM_BATCH)
    return out


@frozen(kw_only=True)
class SimOptions:
    """What to simulate, besides the trace (see ``xce-resize simulate --help``)."""

    malleable_fraction: float = 0.2
    seed: int = 0
    speedup: SpeedupModel = attrs.field(factory=SpeedupModel)
    driver: str = "grow-shrink"
    slots_per_host: int = 1
    limit: int | None = None
    min_factor: float = 0.5
    max_factor: float = 2.0
    #: Driver settings (see :mod:`.drivers`): a job asks to grow at most once per
    #: ``grow_cooldown`` seconds, only for a gain of ``grow_margin`` reconfiguration
    #: costs, and (``grow_when_queue_empty``) only while no job waits; the site shrinks
    #: for the queue's head only when its reserved start is ``shrink_min_delay`` s away.
    grow_cooldown: float = 1800.0
    grow_margin: float = 1.0
    grow_when_queue_empty: bool = True
    shrink_min_delay: float = 0.0
    #: The plugin's ``[resize]`` section (``journal_sync`` defaults to false here, and
    #: ``journal_defer`` to true unless ``journal_sync`` is set).
    resize: Mapping[str, Any] = attrs.field(factory=dict)
    #: Where relative ``policy_files`` of ``resize`` are found.
    base_dir: Path | None = None
    check: bool = True
    #: Injected host failures (``--host-failures``; :mod:`.failures`), in both runs.
    host_failures: HostFailures | None = None

    def __attrs_post_init__(self) -> None:
        if self.driver not in DRIVERS:
            raise ConfigError(f"unknown driver {self.driver!r} (known: {', '.join(DRIVERS)})")
        sph = self.slots_per_host
        if isinstance(sph, bool) or not isinstance(sph, int) or sph < 1:
            raise ConfigError(f"slots per host must be a positive integer, not {sph!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            # 0 jobs would surface later as "the trace has no job to simulate".
            raise ConfigError(f"limit must be a positive integer, not {self.limit!r}")
        for key in ("grow_cooldown", "grow_margin", "shrink_min_delay"):
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0 <= value < math.inf)
            ):
                raise ConfigError(f"{key} must be a finite number >= 0, not {value!r}")
        # The rule checks fraction, seed and factors the same way for every caller.
        self.malleable_rule(1)

    def malleable_rule(self, machine_procs: int) -> MalleableRule:
        """The malleable conversion of these options on a machine of ``machine_procs``."""
        return MalleableRule(
            fraction=self.malleable_fraction,
            seed=self.seed,
            machine_procs=machine_procs,
            min_factor=self.min_factor,
            max_factor=self.max_factor,
        )

    def resize_config(self) -> dict[str, Any]:
        return _sim_resize(self.resize)

    def to_json(self) -> dict[str, Any]:
        return {
            "malleable_fraction": self.malleable_fraction,
            "seed": self.seed,
            "speedup": self.speedup.spec(),
            "driver": self.driver,
            "slots_per_host": self.slots_per_host,
            "limit": self.limit,
            "min_factor": self.min_factor,
            "max_factor": self.max_factor,
            "grow_cooldown": self.grow_cooldown,
            "grow_margin": self.grow_margin,
            "grow_when_queue_empty": self.grow_when_queue_empty,
            "shrink_min_delay": self.shrink_min_delay,
            "resize": {k: self.resize[k] for k in sorted(self.resize)},
            # Only with --host-failures: documents without failures keep their keys.
            **(
                {"host_failures": self.host_failures.spec()}
                if self.host_failures is not None
                else {}
            ),
        }

    def make_driver(self, mode: Mode) -> Driver:
        """The run's driver: the configured one for the elastic run, none for rigid."""
        if mode == "rigid":
            return make_driver("none")
        return make_driver(
            self.driver,
            grow_cooldown=self.grow_cooldown,
            grow_margin=self.grow_margin,
            grow_when_queue_empty=self.grow_when_queue_empty,
            shrink_min_delay=self.shrink_min_delay,
        )


#: Keys of a configuration file's ``[simulate]`` table, with their types.
CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "malleable_fraction": (int, float),
    "seed": (int,),
    "speedup": (str,),
    "driver": (str,),
    "slots_per_host": (int,),
    "limit": (int,),
    "min_factor": (int, float),
    "max_factor": (int, float),
    "grow_cooldown": (int, float),
    "grow_margin": (int, float),
    "grow_when_queue_empty": (bool,),
    "shrink_min_delay": (int, float),
    # A number is the MTBF alone (`host_failures = 200`), as "200" is.
    "host_failures": (str, int, float),
}


def load_options(config: str | os.PathLike[str] | None = None, **overrides: Any) -> SimOptions:
    """Options from a TOML file (``[simulate]``: the keys of :data:`CONFIG_KEYS`;
    ``[resize]``: the plugin's section, e.g. site ``policy_files``), then ``overrides``
    (command-line values; ``None`` means not given). Unknown keys and wrong types are
    a :class:`ConfigError` naming the file and the key."""
    if config is None:
        return options_from_tables(None, {}, **overrides)
    path = Path(config)
    data = read_toml(path)
    unknown = sorted(set(data) - {"simulate", "resize"})
    if unknown:
        raise ConfigError(f"{path}: unknown table [{unknown[0]}] (known: simulate, resize)")
    return options_from_tables(path, data, **overrides)


def options_from_tables(path: Path | None, data: Mapping[str, Any], **overrides: Any) -> SimOptions:
    """Options from the ``[simulate]`` and ``[resize]`` tables of the file ``path``
    (``None``: no file), then ``overrides``, as :func:`load_options`. A bad value is a
    :class:`ConfigError` naming where it came from: ``FILE: [simulate] KEY`` or the
    command-line option (``--KEY``)."""
    values: dict[str, Any] = {}
    resize: dict[str, Any] = {}
    base_dir: Path | None = None
    if path is not None:
        # The file's values are checked even where an option overrides them: a
        # mistake in the file would otherwise wait for the run that does not override.
        table = _simulate_table(path, data)
        values = {k: _checked(f"{path}: [simulate] {k}", k, v) for k, v in table.items()}
        resize = data.get("resize", {})
        if not isinstance(resize, dict):
            raise ConfigError(f"{path}: [resize] must be a table")
        base_dir = path.resolve().parent
    for key, value in overrides.items():
        if value is not None:
            values[key] = _checked("--" + key.replace("_", "-"), key, value)
    if path is not None:
        _check_resize(path, resize, base_dir)
    return SimOptions(resize=resize, base_dir=base_dir, **values)


def _simulate_table(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[simulate]`` table of ``path``: known keys, of the right types."""
    section = data.get("simulate", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [simulate] must be a table")
    for key, value in section.items():
        kinds = CONFIG_KEYS.get(key)
        if kinds is None:
            raise ConfigError(
                f"{path}: [simulate] unknown key {key!r} (known: {', '.join(CONFIG_KEYS)})"
            )
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{path}: [simulate] {key} must be {names}, not {value!r}")
    return dict(section)


def _checked(where: str, key: str, value: Any) -> Any:
    """``value`` of option ``key`` as :class:`SimOptions` takes it (a spec parsed from
    its text), checked on its own so that an error names ``where`` it came from: the
    file and key, or the option (the options' checks have no rule across keys)."""
    try:
        if key == "speedup" and isinstance(value, str):
            value = parse_speedup(value)
        elif key == "host_failures" and isinstance(value, str | int | float):
            text = value if isinstance(value, str) else repr(value)
            value = failures_mod.parse(text)
        elif key == "malleable_fraction" and not isinstance(value, bool):
            value = float(value) + 0.0  # -0.0 is 0.0 (a "-0%" in the report)
        SimOptions(**{key: value})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.detail or exc.message}") from None
    return value


def _check_resize(path: Path, resize: Mapping[str, Any], base_dir: Path | None) -> None:
    """The ``[resize]`` section through the plugin's own checks, and its site policy
    files loaded once, now: each run loads them again as it starts (in a worker process
    for parallel runs and sweeps), where a missing or broken file would only show as
    a failed run."""
    config = _sim_resize(resize)
    try:
        config_mod.check(config)
        get_plugin_manager(config, base_dir=base_dir, entry_points=False)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.detail or exc.message}") from None


@frozen
class Workload:
    """A read trace, its jobs after the malleable conversion, and the cluster."""

    source: str
    trace: Trace
    jobs: tuple[SimJob, ...]
    hosts: tuple[tuple[str, int], ...]

    @property
    def capacity(self) -> int:
        return sum(n for _, n in self.hosts)

    @property
    def malleable(self) -> int:
        return sum(1 for j in self.jobs if j.malleable)


#: The most hosts a simulated cluster has: 2**20, above today's largest machines in
#: nodes; a million one-slot hosts already take about 1 GB before the first job.
MAX_HOSTS = 1 << 20


def host_count(procs: int, slots_per_host: int) -> int:
    """How many hosts :func:`cluster_for` makes, or the :class:`ConfigError` it raises
    (a sweep checks every workload's machine before any run)."""
    if procs < 1:
        raise ConfigError(f"a cluster needs at least one slot, not {procs}")
    count = math.ceil(procs / slots_per_host)
    if count > MAX_HOSTS:
        raise ConfigError(
            f"{procs:,} slots on hosts of {slots_per_host} make {count:,} hosts, more than "
            f"the simulator takes ({MAX_HOSTS:,}): give more slots per host "
            "(--slots-per-host, or slots_per_host under [simulate])"
        )
    return count


def machine_procs(trace: Trace) -> int:
    """The slots of the machine a trace runs on: its ``MaxProcs``, else its largest job."""
    return trace.header.max_procs or max(j.procs for j in trace.jobs)


def cluster_for(procs: int, slots_per_host: int) -> tuple[tuple[str, int], ...]:
    """``procs`` slots on hosts of ``slots_per_host`` (the last host may have fewer),
    named ``n001``... with a fixed width so that names sort in host order. More than
    :data:`MAX_HOSTS` hosts is a :class:`ConfigError` (a trace's absurd ``MaxProcs`` or
    job size would otherwise take the memory of the machine before anything runs)."""
    count = host_count(procs, slots_per_host)
    width = max(3, len(str(count)))
    hosts = []
    left = procs
    for i in range(count):
        n = min(slots_per_host, left)
        hosts.append((f"n{i + 1:0{width}d}", n))
        left -= n
    return tuple(hosts)


@gc_paused
def load_workload(path: str | os.PathLike[str], options: SimOptions) -> Workload:
    """Read the trace, size the cluster, convert the malleable share."""
    return workload_of(read_trace(path, limit=options.limit), path, options)


@gc_paused
def workload_of(trace: Trace, path: str | os.PathLike[str], options: SimOptions) -> Workload:
    """Size the cluster for a read (or generated) trace and convert the malleable share."""
    if not trace.jobs:
        raise SimulationError(f"{path}: the trace has no job to simulate")
    procs = machine_procs(trace)
    hosts = cluster_for(procs, options.slots_per_host)
    jobs = tuple(convert(trace.jobs, options.malleable_rule(procs)))
    return Workload(os.fspath(path), trace, jobs, hosts)


@frozen
class RunResult:
    """One run: its metrics, the problems its checks found, and what the plot needs."""

    mode: str
    metrics: RunMetrics
    problems: tuple[str, ...]
    events: int
    requests: int
    refused: Mapping[str, int]
    backfilled: int | None
    usage: tuple[float, ...]
    waits: tuple[float, ...]
    #: Wall-clock seconds the run took (not part of the JSON: it is not deterministic).
    seconds: float = 0.0
    #: One row per job (:mod:`.jobs_csv`), when asked for (not part of the JSON).
    jobs: tuple[JobRow, ...] = ()
    #: What injected host failures did (``None``: none were injected).
    failures: FailureStats | None = None
    #: The plugin's warnings during the run, counted by kind (:mod:`.run_log`).
    warnings: tuple[LogSummary, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.metrics.to_json())
        out["events"] = self.events
        out["resize_requests"] = self.requests
        out["refused_requests"] = dict(self.refused)
        if self.backfilled is not None:
            out["backfilled"] = self.backfilled
        out["checks"] = {"ok": not self.problems, "problems": list(self.problems)}
        out["utilization_over_time"] = list(self.usage)
        if self.failures is not None:
            out["host_failures"] = self.failures.to_json()
        out["warnings"] = [w.to_json() for w in self.warnings]
        return out


@attrs.define
class Feeder:
    """Submits the trace's jobs as they arrive (one timeline entry at a time, so the
    controller never holds more than the jobs that arrived and have not ended)."""

    ctl: EmbeddedController
    jobs: Sequence[SimJob]
    mode: Mode
    model: SpeedupModel
    on_submit: Callable[[SimJob, bool, SpeedupWork | None], None]
    #: The next job to submit (a later segment of a time-parallel run starts past 0).
    i: int = 0

    def start(self) -> None:
        if self.i < len(self.jobs):
            self.ctl.at(self.jobs[self.i].submit, self.feed)

    def feed(self) -> None:
        jobs, ctl, n = self.jobs, self.ctl, len(self.jobs)
        i = self.i
        t = jobs[i].submit
        while i < n and jobs[i].submit == t:
            self.submit(jobs[i])
            i += 1
        self.i = i
        if i < n:
            ctl.at(jobs[i].submit, self.feed)

    def submit(self, job: SimJob) -> None:
        estimate = job.estimate
        flexible = self.mode == "elastic" and job.min_procs < job.max_procs
        if not flexible:
            self.on_submit(job, False, None)
            self.ctl.submit(
                job.user, job.procs, runtime=job.runtime, estimate=estimate, job_id=job.id
            )
            return
        # A malleable (or moldable) job: any size in its range, started at its recorded
        # size when that fits; its end follows from the sizes it runs at.
        work = SpeedupWork(self.model, job.runtime, job.procs, estimate)
        self.on_submit(job, True, work)
        self.ctl.submit(
            job.user,
            (job.min_procs, job.max_procs),
            runtime=job.runtime,
            estimate=estimate,
            job_id=job.id,
            resizable=job.malleable,
            start_tasks=job.procs,
            work=work,
        )


def run_mode(
    workload: Workload,
    options: SimOptions,
    mode: Mode,
    *,
    progress: ProgressFn | None = None,
    state_dir: Path | None = None,
    observers: Sequence[Any] = (),
    record: str | os.PathLike[str] | None = None,
    job_rows: bool = False,
) -> RunResult:
    """Run the workload once in ``mode``, with the plugin, and check and measure it.

    :param state_dir: where the plugin's journal goes (default: a temporary
        directory, removed afterwards).
    :param observers: extra :class:`~.observer.Observer` objects (tests).
    :param record: write a recording of the run's inputs there (:mod:`.recording`).
    :param job_rows: keep one row per job in :attr:`RunResult.jobs` (``--jobs-out``).
    """
    if job_rows:
        malleable = {j.id for j in workload.jobs if j.malleable} if mode == "elastic" else set()
        rows = JobRows(mode, malleable)
        result = run_mode(
            workload,
            options,
            mode,
            progress=progress,
            state_dir=state_dir,
            observers=[*observers, rows],
            record=record,
        )
        return attrs.evolve(result, jobs=rows.sorted_rows())
    if state_dir is None:
        with tempfile.TemporaryDirectory(prefix=f"xce-simulate-{mode}-") as tmp:
            return run_mode(
                workload,
                options,
                mode,
                progress=progress,
                state_dir=Path(tmp),
                observers=observers,
                record=record,
            )
    if record is not None:
        with open(record, "w", encoding="utf-8") as out:
            return result_of(
                gather_run(workload, options, mode, state_dir, progress, observers, out)
            )
    return result_of(gather_run(workload, options, mode, state_dir, progress, observers))


#: Drives a prepared run instead of running it whole (.segments): called with the
#: controller and the run's parts; returns the job index where it stopped the run for
#: good, or ``None`` if it ran it to the end.
Stepper = Callable[[EmbeddedController, "RunParts"], int | None]


def gather_run(
    workload: Workload,
    options: SimOptions,
    mode: Mode,
    state_dir: Path,
    progress: ProgressFn | None = None,
    observers: Sequence[Any] = (),
    record: IO[str] | None = None,
    *,
    first: int = 0,
    stepper: Stepper | None = None,
) -> Gathered:
    """One run with the plugin, and what its observers gathered.

    :param first: the index of the first job submitted (a later segment of a
        time-parallel run, .segments, starts past 0 on an empty machine).
    :param stepper: drives the run in pauses instead of :meth:`EmbeddedController.run`.
    """
    began = time.perf_counter()
    driver = options.make_driver(mode)
    # A shrinking driver is the plugin's reclaim policy turned on (.drivers).
    config = _absolute_policies(
        {**options.resize_config(), **driver.resize_settings()}, options.base_dir
    )
    pm = get_plugin_manager(config, base_dir=options.base_dir, entry_points=False)
    recorder = SimRecorder(RecordingWriter(record)) if record is not None else None
    tasks: TaskRunner = SimTaskRunner()
    notes: NotificationRunner = ScriptedNotificationRunner()
    if recorder is not None:
        tasks, notes = recorder.task_runner(tasks), recorder.notification_runner(notes)
    ctl = EmbeddedController(
        pm,
        state_dir,
        hosts=list(workload.hosts),
        config=config,
        store="none",
        task_runner=tasks,
        notification_runner=notes,
        protect_reservation=True,
        keep_finished=False,
        lean_cycles=True,
    )
    if recorder is not None:
        recorder.attach(ctl, workload.hosts)
    # The plugin's per-job warnings are counted for the report, not printed (.run_log).
    with tally_warnings() as tally:
        try:
            parts = _attach(ctl, workload, options, mode, driver, progress, observers, recorder)
            parts.tally = tally
            parts.feeder.i = first
            parts.feeder.start()
            if parts.injector is not None:
                parts.injector.start()
            stopped = None
            if stepper is None:
                ctl.run()
            else:
                stopped = stepper(ctl, parts)
            if progress is not None and stopped is None:
                progress(mode, parts.stats.ended, len(workload.jobs))
            # A segment stopped for good hands over before the end: nothing to say yet.
            end = (
                (tuple(ctl.rejections), tuple(ctl.check_invariants()))
                if stopped is None
                else ((), ())
            )
            seconds = time.perf_counter() - began
        finally:
            ctl.stop()
        gathered = parts.gathered(end, seconds, stopped, tally.summaries())
    if recorder is not None:
        recorder.finish(state_dir / "resize")
    return gathered


def _absolute_policies(config: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """``config`` with its ``policy_files`` made absolute from ``base_dir`` (the
    configuration file's directory): the same files are loaded, and a recording of the
    run names them wherever it is replayed from (``--trust-policy-files``)."""
    files = config.get("policy_files")
    if base_dir is None or not isinstance(files, list):
        return config
    absolute = [str(base_dir / f) if not Path(str(f)).is_absolute() else f for f in files]
    return {**config, "policy_files": absolute}


@attrs.define(eq=False)
class RunParts:
    """What a run is made of besides its controller: the observers that gather its
    results, the driver that acts on it, and what feeds it jobs and host failures."""

    mode: Mode
    total: int
    stats: RunStats
    checks: _RunChecks | None
    driver: Driver
    feeder: Feeder
    injector: FailureInjector | None
    extra: Sequence[Any]
    #: The run's warnings tally (.run_log), once the run is under way.
    tally: LogTally | None = None

    def gathered(
        self,
        end: tuple[tuple[tuple[float, str, str], ...], tuple[str, ...]],
        seconds: float,
        stopped: int | None,
        warnings: tuple[LogSummary, ...],
    ) -> Gathered:
        """What the run gathered (picklable: a segment's travels to the parent);
        ``end`` is the controller's rejected arrivals and broken invariants."""
        self.stats.detach_progress()
        return Gathered(
            mode=self.mode,
            total=self.total,
            stats=self.stats,
            checks=self.checks,
            requests=self.driver.requests,
            refused=self.driver.refused,
            warnings=warnings,
            rejections=end[0],
            invariants=end[1],
            seconds=seconds,
            failures=self.injector.stats if self.injector is not None else None,
            stopped=stopped,
        )


def _attach(
    ctl: EmbeddedController,
    workload: Workload,
    options: SimOptions,
    mode: Mode,
    driver: Driver,
    progress: ProgressFn | None,
    observers: Sequence[Any],
    recorder: SimRecorder | None,
) -> RunParts:
    jobs = workload.jobs
    total = len(jobs)
    stats = RunStats(
        workload.capacity,
        total,
        None if progress is None else (lambda done, n: progress(mode, done, n)),
    )
    checks_on = options.check
    failing = options.host_failures is not None
    checks = _RunChecks(workload, mode, options.speedup, failing)

    def on_submit(job: SimJob, flexible: bool, work_model: SpeedupWork | None) -> None:
        if recorder is not None:
            recorder.submit(
                job.id,
                user=job.user,
                tasks=(job.min_procs, job.max_procs) if flexible else (job.procs, job.procs),
                estimate=job.estimate,
                start_tasks=job.procs if flexible else None,
                resizable=job.malleable and flexible,
                work=work_model,
            )
        if job.malleable and flexible:
            spec = MalleableSpec(job.user, job.min_procs, job.max_procs, job.procs, work_model)
            driver.add_spec(job.id, spec)
        if checks_on:
            checks.add_job(job, flexible)

    ctl.add_observer(stats)
    for observer in (*(checks.all if checks_on else ()), *observers):
        ctl.add_observer(observer)
    if recorder is not None:
        driver.on_request = recorder.request
    ctl.add_observer(driver)  # last: it acts on what the others have seen
    feeder = Feeder(ctl, jobs, mode, options.speedup, on_submit)
    injector = None
    if options.host_failures is not None:
        # Nothing is left to fail for once every job is in and none waits or runs.
        def active() -> bool:
            return feeder.i < total or ctl.pending_count > 0 or stats.running > 0

        names = [h for h, _ in workload.hosts]
        injector = FailureInjector(ctl, names, options.host_failures, options.seed, active)
    return RunParts(
        mode, total, stats, checks if checks_on else None, driver, feeder, injector, observers
    )


@attrs.define(eq=False)
class Gathered:
    """What one run (or one segment of it, .segments) gathered: its observers' data and
    what the controller said at the end. :func:`result_of` makes the run's result."""

    mode: Mode
    total: int
    stats: RunStats
    checks: _RunChecks | None
    requests: int
    refused: Mapping[str, int]
    warnings: tuple[LogSummary, ...]
    rejections: tuple[tuple[float, str, str], ...]
    invariants: tuple[str, ...]
    seconds: float
    failures: FailureStats | None
    #: Where a segment stopped for good (the job index of the pause), else ``None``.
    stopped: int | None = None


def result_of(g: Gathered) -> RunResult:
    """A run's result from what it gathered."""
    metrics = g.stats.metrics()
    problems: list[str] = []
    if g.checks is not None:
        problems = g.checks.problems(g.rejections, g.invariants, metrics, g.stats.usage.peak)
    events = g.total + g.stats.started + g.stats.ended + metrics.resizes + g.requests
    easy = g.checks.easy if g.checks is not None else None
    return RunResult(
        mode=g.mode,
        metrics=metrics,
        problems=tuple(problems),
        events=events,
        requests=g.requests,
        refused=dict(sorted(g.refused.items())),
        backfilled=easy.backfilled if easy is not None else None,
        usage=tuple(g.stats.usage.bins(USAGE_BINS, metrics.makespan)),
        waits=tuple(g.stats.waits),
        seconds=g.seconds,
        failures=g.failures,
        warnings=g.warnings,
    )


class _RunChecks:
    """The checks of one run (:mod:`.checks`), fed the jobs as they are submitted."""

    def __init__(
        self, workload: Workload, mode: Mode, speedup: SpeedupModel, failing: bool = False
    ) -> None:
        self.capacity = workload.capacity
        # With injected host failures a job may end EXIT for that reason, and the
        # schedule is no longer the textbook EASY one of the whole cluster.
        self.completion = CompletionCheck(allow_host_failure=failing)
        self.ledger = LedgerCheck(dict(workload.hosts))
        self.work = WorkCheck(speedup)
        # The FCFS + EASY order holds for the rigid run only (resizes move ends).
        self.easy = EasyCheck(workload.capacity) if mode == "rigid" and not failing else None
        self.all: tuple[CompletionCheck | LedgerCheck | WorkCheck | EasyCheck, ...] = (
            self.completion,
            self.ledger,
            self.work,
            *([self.easy] if self.easy else []),
        )

    def add_job(self, job: SimJob, flexible: bool) -> None:
        self.completion.add_job(job.id)
        self.work.add_job(job.id, job.runtime, job.procs, flexible)
        if self.easy is not None:
            self.easy.add_job(job.id, job.submit, job.procs, job.estimate)

    def problems(
        self,
        rejections: Sequence[tuple[float, str, str]],
        invariants: Sequence[str],
        metrics: RunMetrics,
        peak: int,
    ) -> list[str]:
        """What the checks found once the run is over (with the controller's rejected
        arrivals and the invariants it found broken at the end)."""
        self.completion.rejected(rejections)
        problems: list[str] = []
        for check in self.all:
            problems.extend(check.finish())
        problems.extend(check_utilization(metrics.utilization, peak, self.capacity))
        problems.extend(invariants)
        return problems
