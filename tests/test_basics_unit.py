"""hvdlite's basics without MPI: the queries before init(), the names the package
serves, and the form of its log lines."""

from __future__ import annotations

import logging

import pytest

from hvdlite import config


def test_queries_before_init_say_to_call_init():
    import hvdlite as hvd

    assert not hvd.is_initialized()
    for query in (
        hvd.size,
        hvd.rank,
        hvd.local_size,
        hvd.local_rank,
        hvd.cross_size,
        hvd.cross_rank,
        hvd.is_homogeneous,
    ):
        with pytest.raises(ValueError, match=r"init\(\)"):
            query()
    # (That the queries do not start MPI is checked in a fresh interpreter by
    # tests/mpi_scripts/core_import_light.py, run from test_core_launch.py.)


def test_hvdlite_serves_only_its_documented_names():
    # Everything hvdlite serves lazily is in its __all__, and the engine's seams for
    # the adapters (submit_control, call_and_wait, waiting_caller) are not served.
    import hvdlite
    from hvdlite import basics, collectives, dynamic_sets, objects

    lazily_served = set(collectives.__all__) | set(objects.__all__) | set(dynamic_sets.__all__)
    assert lazily_served <= set(hvdlite.__all__)
    for seam in ("submit_control", "call_and_wait", "waiting_caller", "state"):
        assert seam not in hvdlite.__all__ and seam not in basics.__all__
        with pytest.raises(AttributeError):
            getattr(hvdlite, seam)


@pytest.mark.parametrize("hide,stamped", [(False, True), (True, False)])
def test_log_lines_carry_a_time_stamp_unless_hidden(monkeypatch, hide, stamped):
    from hvdlite import basics

    log = logging.getLogger("hvdlite")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "level", log.level)
    basics._configure_logging("WARNING", 3, hide_time=hide)
    fmt = log.handlers[0].formatter._fmt
    assert fmt.startswith("[hvdlite rank 3] ") and ("%(asctime)s" in fmt) is stamped
    assert config.read_config({"HOROVOD_LOG_HIDE_TIME": "1"}).log_hide_time is True
