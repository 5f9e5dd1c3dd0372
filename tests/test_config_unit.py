"""The knobs (hvdlite.config): defaults, Horovod's names beside hvdlite's, parsing
and the errors that name the variable, and which knobs every rank must agree on."""

from __future__ import annotations

import pytest

from hvdlite import config

pytestmark = pytest.mark.timeout(60)


def test_defaults_from_an_empty_environment():
    cfg = config.read_config({})
    assert cfg == config.Config()
    assert cfg.fusion_threshold == 64 * 1024 * 1024 and cfg.cache_capacity == 1024
    assert cfg.stall_check_time_seconds == 60.0 and cfg.stall_shutdown_time_seconds == 0.0


def test_every_knob_has_a_horovod_name_and_a_config_field():
    fields = {f.name for f in config.dataclasses.fields(config.Config)}
    for knob in config.KNOBS:
        assert knob.env.startswith("HVDLITE_")
        assert knob.horovod_env == "HOROVOD_" + knob.env[len("HVDLITE_") :]
        assert knob.attr in fields
        assert getattr(config.Config(), knob.attr) == knob.default


def test_a_message_names_the_variable_that_set_a_knob():
    assert config.variable_of("timeline", {"HOROVOD_TIMELINE": "t.json"}) == "HOROVOD_TIMELINE"
    both = {"HOROVOD_TIMELINE": "a", "HVDLITE_TIMELINE": "b"}
    assert config.variable_of("timeline", both) == "HVDLITE_TIMELINE"
    assert config.variable_of("timeline", {}) == "HVDLITE_TIMELINE"


def test_horovod_names_accepted_and_hvdlite_wins():
    cfg = config.read_config({"HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CACHE_CAPACITY": "7"})
    assert cfg.fusion_threshold == 1024 and cfg.cache_capacity == 7
    cfg = config.read_config(
        {"HOROVOD_FUSION_THRESHOLD": "1024", "HVDLITE_FUSION_THRESHOLD": "2048"}
    )
    assert cfg.fusion_threshold == 2048
    knob = next(k for k in config.KNOBS if k.attr == "cycle_time_ms")
    assert config.env_value(knob, {"HOROVOD_CYCLE_TIME": "3"}) == "3"
    assert config.env_value(knob, {"HOROVOD_CYCLE_TIME": "3", "HVDLITE_CYCLE_TIME": "4"}) == "4"
    assert config.env_value(knob, {}) is None


@pytest.mark.parametrize(
    "raw,value",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("off", False),
        ("", False),
    ],
)
def test_bool_knobs(raw, value):
    assert (
        config.read_config({"HVDLITE_HIERARCHICAL_ALLREDUCE": raw}).hierarchical_allreduce is value
    )


def test_numbers_and_strings():
    cfg = config.read_config(
        {
            "HVDLITE_FUSION_THRESHOLD": " 1e6 ",
            "HVDLITE_CYCLE_TIME": "0.5",
            "HVDLITE_LOG_LEVEL": "debug",
            "HVDLITE_TIMELINE": "timeline.json",
            "HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
            "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3",
            "HVDLITE_TEST_NODE_SIZE": "2",
            "HVDLITE_CACHE_CAPACITY": "",
        }
    )
    assert cfg.fusion_threshold == 1_000_000 and cfg.cycle_time_ms == 0.5
    assert cfg.log_level == "DEBUG" and cfg.timeline == "timeline.json"
    assert cfg.stall_check_time_seconds == 1.0 and cfg.stall_shutdown_time_seconds == 3.0
    assert cfg.test_node_size == 2
    assert cfg.cache_capacity == 1024  # empty: the default


@pytest.mark.parametrize(
    "raw,value",
    [
        ("auto", "auto"),
        ("", "auto"),
        (" ON ", "on"),
        ("1", "on"),
        ("true", "on"),
        ("off", "off"),
        ("0", "off"),
        ("no", "off"),
    ],
)
def test_overlap_knob(raw, value):
    assert config.read_config({"HVDLITE_OVERLAP": raw}).overlap == value
    assert config.read_config({"HOROVOD_OVERLAP": raw}).overlap == value


@pytest.mark.parametrize(
    "env,var",
    [
        ({"HVDLITE_FUSION_THRESHOLD": "lots"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HOROVOD_FUSION_THRESHOLD": "lots"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HVDLITE_FUSION_THRESHOLD": "-1"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HVDLITE_CACHE_CAPACITY": "-3"}, "HVDLITE_CACHE_CAPACITY"),
        ({"HVDLITE_CYCLE_TIME": "0"}, "HVDLITE_CYCLE_TIME"),
        ({"HVDLITE_CYCLE_TIME": "fast"}, "HVDLITE_CYCLE_TIME"),
        ({"HVDLITE_STALL_CHECK_DISABLE": "maybe"}, "HVDLITE_STALL_CHECK_DISABLE"),
        ({"HVDLITE_LOG_LEVEL": "LOUD"}, "HVDLITE_LOG_LEVEL"),
        ({"HVDLITE_TEST_NODE_SIZE": "-2"}, "HVDLITE_TEST_NODE_SIZE"),
        ({"HVDLITE_OVERLAP": "sometimes"}, "HVDLITE_OVERLAP"),
    ],
)
def test_bad_values_raise_value_error_naming_the_variable(env, var):
    with pytest.raises(ValueError) as info:
        config.read_config(env)
    assert var in str(info.value)


def test_bad_bool_message_says_what_is_valid():
    with pytest.raises(ValueError, match="0 or 1"):
        config.read_config({"HVDLITE_DYNAMIC_PROCESS_SETS": "perhaps"})


@pytest.mark.parametrize(
    "var",
    [
        "HVDLITE_CYCLE_TIME",
        "HVDLITE_STALL_CHECK_TIME_SECONDS",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS",
        "HVDLITE_COLLECTIVE_TIMEOUT",
        "HVDLITE_FUSION_THRESHOLD",
        "HVDLITE_CACHE_CAPACITY",
        "HVDLITE_TEST_NODE_SIZE",
    ],
)
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e999"])
def test_non_finite_numbers_are_refused_naming_the_variable(var, raw):
    with pytest.raises(ValueError) as info:
        config.read_config({var: raw})
    assert var in str(info.value) and "is not valid" in str(info.value)


@pytest.mark.parametrize(
    "env,words",
    [
        ({"HVDLITE_CYCLE_TIME": "1e9"}, "at most 10000"),
        ({"HVDLITE_COLLECTIVE_TIMEOUT": "-1"}, "HVDLITE_COLLECTIVE_TIMEOUT must be >= 0"),
        ({"HVDLITE_STALL_CHECK_TIME_SECONDS": "-5"}, "HVDLITE_STALL_CHECK_TIME_SECONDS"),
    ],
)
def test_out_of_range_numbers_are_refused(env, words):
    with pytest.raises(ValueError, match=words):
        config.read_config(env)


def test_the_collective_timeout_knob_reads_both_spellings():
    assert config.read_config({}).collective_timeout == 0.0
    assert config.read_config({"HOROVOD_COLLECTIVE_TIMEOUT": "7.5"}).collective_timeout == 7.5


def test_knobs_that_must_agree_are_the_ones_that_change_collective_behaviour():
    agreed = {k.attr for k in config.KNOBS if k.agree}
    assert agreed == {
        "fusion_threshold",
        "cache_capacity",
        "hierarchical_allreduce",
        "hierarchical_allgather",
        "shm_allreduce_disable",
        "ring_allreduce_disable",
        "half_sums_per_hop",
        "dynamic_process_sets",
        "test_node_size",
        "bucket_cap_mb",
        # the order check bypasses the response cache on every rank or none
        "check_order",
        # autotune: its status-vector field, and rank 0's sampling for all
        "autotune",
        "autotune_warmup_samples",
        "autotune_steps_per_sample",
        "autotune_bayes_opt_max_samples",
        "autotune_gaussian_process_noise",
    }


def test_disagreements_name_the_knob_the_ranks_and_the_values():
    base = config.read_config({})
    other = config.read_config(
        {"HVDLITE_FUSION_THRESHOLD": "1024", "HVDLITE_CYCLE_TIME": "5"}
    )  # cycle time may differ
    per_rank = [config.agreed_values(c) for c in (base, other, base)]
    lines = config.disagreements(per_rank)
    assert len(lines) == 1
    assert "HVDLITE_FUSION_THRESHOLD" in lines[0]
    assert "ranks 0, 2: 67108864" in lines[0] and "rank 1: 1024" in lines[0]


def test_a_malformed_thread_affinity_is_refused():
    with pytest.raises(ValueError, match="HVDLITE_THREAD_AFFINITY='0,x'"):
        config.read_config({"HVDLITE_THREAD_AFFINITY": "0,x"})
    assert config.read_config({"HOROVOD_THREAD_AFFINITY": "0, 8"}).thread_affinity == "0, 8"
