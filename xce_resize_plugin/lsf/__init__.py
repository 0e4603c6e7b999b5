"""The LSF-compatible ``bresize`` command: its grammar and its logic.

Below every layer that runs it: the ``bresize`` command itself (:mod:`..cli.bresize`,
the HTTP transport and the entry point) and scenario files (:mod:`..scenarios.runner`,
which run ``bresize`` lines through this very logic in process, so that a scenario tests
exactly what users type). Standard library only at module level, so that ``bresize``
starts fast (docs/performance.md, "bresize -V").

- :mod:`.bresize_args`: the command-line grammar, parsed by hand;
- :mod:`.bresize_run`: one command line executed with a given transport, LSF's exit
  codes and messages;
- :mod:`.lean`: what this path uses instead of :mod:`typing`.
"""
