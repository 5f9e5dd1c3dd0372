"""hvdlite's launcher, ``hvdrun`` (console script; also ``python -m hvdlite.runner``).

Layers, from the outside in:

- :mod:`.cli` -- the entry point: options in, exit status out;
- :mod:`.options` (flags, knob variables), :mod:`.configfile`
  (``--config-file``, flat or horovodrun's layout), :mod:`.hosts`
  (``-H``/``--hostfile``), :mod:`.slurm` (allocation variables),
  :mod:`.mpi` (which MPI), :mod:`.command` (the launcher's argument list);
- :mod:`.sshcheck` -- before a job with other hosts, checks that ssh can log in
  to each (as horovodrun does);
- :mod:`.job` -- runs the launcher, passes output through, stops the job on
  the first failure or a signal, and :mod:`.report` says what failed;
- :mod:`.elastic_driver` -- with an elastic option, the relaunch loop around
  :mod:`.job`: hosts from :mod:`.discovery` (script, SLURM, fixed) minus
  :mod:`.blacklist`, ordered by :mod:`.elastic_hosts`, options checked by
  :mod:`.elastic_settings`; the ranks' side is :mod:`hvdlite.elastic`;
- :mod:`.runfunc` -- :func:`run` (``hvdlite.run``): a Python function on every
  rank through the same machinery, each rank running :mod:`.run_task`;
- :mod:`.task_wrapper` -- runs on every rank around the user's command and
  reports its start and exit through :mod:`.protocol` status lines;
  :mod:`.rankenv` tells a process its rank from the launcher's variables, and
  :mod:`.lifeline` ends every rank when hvdrun dies, even by SIGKILL.

Importing this package imports neither mpi4py nor a framework: the launcher
process never initializes MPI (``--check-build`` probes in child processes).
"""

from __future__ import annotations

__all__ = ["main", "run", "RankFailedError"]


def main(argv=None) -> int:
    """Run hvdrun; see :func:`hvdlite.runner.cli.main`."""
    from .cli import main as _main

    return _main(argv)


def __getattr__(name):
    # run() is loaded on first use, so that importing the package stays cheap.
    if name in ("run", "RankFailedError"):
        from . import runfunc

        return getattr(runfunc, name)
    raise AttributeError(f"module 'hvdlite.runner' has no attribute {name!r}")
