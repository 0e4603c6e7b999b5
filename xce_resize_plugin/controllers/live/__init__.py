"""The live embedded controller: real time, real processes, REST on loopback.

- :mod:`.settings`: the TOML configuration (``[controller]``, ``[cluster]``, ``[users]``,
  ``[limits]``, ``[resize]``);
- :mod:`.worker`: the per-host worker agent (``xce-resize worker``) that runs tasks and
  notification commands; :mod:`.proc`, the process helpers it shares with the controller;
- :mod:`.tasks`: the controller's channels to the agents (commands, events, liveness);
- :mod:`.live_store`: the controller's own LMDB state with fencing;
- :mod:`.storage_faults`: what an error of the write path means (fenced, or the disk);
- :mod:`.submission`: a job submission (``POST /v1/jobs``), checked, and who the job
  runs as;
- :mod:`.live_controller`: :class:`~.live_controller.LiveController`, which holds an
  embedded controller on the wall clock, built in layers (:mod:`.live_state`,
  :mod:`.task_commands`, :mod:`.protocol`, :mod:`.job_ends`, :mod:`.generations`,
  :mod:`.agents`, :mod:`.hook_monitor`, :mod:`.host_api`);
- :mod:`.host_routes` and :mod:`.server`: the REST API and the ``xce-resize controller``
  process.

Nothing heavy is imported here: the command line imports what it runs.
See docs/live-controller.md.
"""
