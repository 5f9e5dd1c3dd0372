"""Autotune without MPI: the setting's wire form, the search space, the optimiser,
rank 0's tuner (on a synthetic score, with a fake clock), the CSV log, the knobs
and the error without scikit-learn."""

import csv
import math
import sys

import numpy as np
import pytest

from hvdlite import config
from hvdlite.autotune import (
    BayesianOptimizer,
    SampleLog,
    SearchSpace,
    Setting,
    Tuner,
    TuningLink,
    prepare,
    require_scikit_learn,
)
from hvdlite.autotune.setting import WORDS, from_words, to_words
from hvdlite.engine.status import Layout, combine, decode, encode

pytestmark = pytest.mark.timeout(60)

START = Setting(64 * 1024, 20.0, True, False)
BEST = Setting(8 << 20, 2.0, True, False)


def synthetic_score(setting: Setting) -> float:
    """Bytes per second, best at 8 MiB, 2 ms, shared memory on."""
    t = math.log2(setting.fusion_threshold) - 23
    c = math.log(setting.cycle_time_ms / 2.0)
    shm = 0.0 if setting.shared_memory_allreduce else 0.1
    return 1e9 / (1.0 + 0.02 * t * t + 0.05 * c * c + shm)


def run_tuner(tuner: Tuner, clock: list, seed: int = 0, steps: int = 2000) -> int:
    """Drive *tuner* through training steps of two cycles each; the step takes as
    long as the synthetic score says (3 % noise).  Returns the steps taken."""
    rng = np.random.default_rng(seed)
    keys = [(0, f"grad.{i}") for i in range(6)]
    for step in range(steps):
        if tuner.finished:
            return step
        score = synthetic_score(tuner.setting) * (1 + 0.03 * rng.standard_normal())
        tuner.observe(keys[:3], 3_000_000)
        tuner.observe(keys[3:], 3_000_000)
        clock[0] += 6_000_000 / score
    return steps


def make_tuner(noise=0.1, warmup=2, steps=5, samples=20, log=None, clock=None):
    space = SearchSpace(START, shared_memory=True)
    timing = {"clock": lambda: clock[0]} if clock else {}
    return Tuner(
        space,
        BayesianOptimizer(space.features, noise),
        warmup_samples=warmup,
        steps_per_sample=steps,
        max_samples=samples,
        sample_log=log,
        **timing,
    )


def test_setting_words_round_trip_through_the_status_and():
    for setting in (START, BEST, Setting(0, 2.5, False, True), Setting(1 << 40, 0.123, True, True)):
        for final in (False, True):
            words = to_words(setting, final)
            assert from_words(words) == (setting, final)
            # Rank 0 sends the words, the others all ones: the AND is rank 0's words.
            layout = Layout.of(70, 3, after_wait=True, root_words=WORDS)
            vectors = [
                encode(layout, 1, 5, 5, 0, 0, root=words),
                encode(layout, 2, 5, 1, 0, None),
                encode(layout, 0, 4, 0, 0, 2),
            ]
            status = decode(layout, combine(vectors))
            assert status.root == words and status.flags == 3 and status.ringers == 2
    assert (
        decode(Layout.of(70, 3, False), combine([encode(Layout.of(70, 3, False), 1, 1, 1, 0)])).root
        == 0
    )


def test_search_space_holds_the_start_and_spreads_from_it():
    space = SearchSpace(Setting(3 << 20, 2.5, True, False), shared_memory=True)
    assert space.settings[0] == space.start and len(space) == 13 * 7 * 2 + 1
    assert space.features.shape == (len(space), 3)
    assert space.features.min() >= 0 and space.features.max() <= 1
    first = space.spread(4)
    assert first[0] == 0 and len(set(first)) == 4 and first == space.spread(4)
    flat = SearchSpace(START)  # no switch tuned: every candidate keeps the start's switches
    assert flat.features.shape[1] == 2
    assert {(s.shared_memory_allreduce, s.hierarchical_allreduce) for s in flat.settings} == {
        (True, False)
    }


def test_optimizer_is_deterministic_and_finds_the_best_region():
    space = SearchSpace(START, shared_memory=True)

    def trace():
        opt = BayesianOptimizer(space.features, noise=0.1, seed=3)
        picks = []
        for index in space.spread(4):
            opt.add(index, synthetic_score(space.settings[index]))
        for _ in range(10):
            index = opt.propose()
            picks.append(index)
            opt.add(index, synthetic_score(space.settings[index]))
        return picks, opt.best()

    picks, best = trace()
    assert (picks, best) == trace()
    assert synthetic_score(space.settings[best]) >= 0.95 * synthetic_score(BEST)


def test_tuner_converges_on_a_synthetic_score_and_logs_every_sample(tmp_path):
    clock = [0.0]
    path = tmp_path / "autotune.csv"
    tuner = make_tuner(log=SampleLog(str(path)), clock=clock)
    assert tuner.setting == START  # the first samples run the knobs the job started with
    steps = run_tuner(tuner, clock)
    assert tuner.finished and tuner.samples == 20 and tuner.warmups == 2
    assert synthetic_score(tuner.setting) >= 0.95 * synthetic_score(BEST)
    # Each sample: 5 steps, plus one unmeasured step after a change of setting.
    assert steps <= 1 + 22 * 6
    rows = list(csv.DictReader(path.open()))
    assert [r["phase"] for r in rows] == ["warmup"] * 2 + ["sample"] * 20 + ["best"]
    assert [int(r["sample"]) for r in rows[2:22]] == list(range(1, 21))
    assert int(rows[2]["fusion_threshold_bytes"]) == START.fusion_threshold
    assert float(rows[2]["cycle_time_ms"]) == START.cycle_time_ms
    assert all(int(r["steps"]) == 5 for r in rows[:22])
    # The score is bytes per second over the sample: 5 steps of 6 MB each.
    first = rows[2]
    assert float(first["score_bytes_per_second"]) == pytest.approx(
        30e6 / float(first["seconds"]), rel=1e-3
    )
    assert (
        Setting(
            int(rows[-1]["fusion_threshold_bytes"]),
            float(rows[-1]["cycle_time_ms"]),
            rows[-1]["shared_memory_allreduce"] == "1",
            rows[-1]["hierarchical_allreduce"] == "1",
        )
        == tuner.setting
    )
    # The best row scores the mean of the samples of the setting kept.
    kept_scores = [
        float(r["score_bytes_per_second"])
        for r in rows[2:22]
        if int(r["fusion_threshold_bytes"]) == tuner.setting.fusion_threshold
        and float(r["cycle_time_ms"]) == tuner.setting.cycle_time_ms
        and (r["shared_memory_allreduce"] == "1") == tuner.setting.shared_memory_allreduce
    ]
    assert float(rows[-1]["score_bytes_per_second"]) == pytest.approx(
        sum(kept_scores) / len(kept_scores), rel=1e-3
    )
    # Settled: more steps change nothing and measure nothing.
    kept = tuner.setting
    run_tuner(tuner, clock, steps=50)
    assert tuner.setting == kept and tuner.samples == 20


def test_tuner_counts_steps_by_names_that_come_round():
    clock = [0.0]
    tuner = make_tuner(warmup=0, steps=3, samples=2, clock=clock)
    for _step in range(4):  # boundary at step 1 starts the sample; 3 more steps end it
        clock[0] += 1.0
        tuner.observe([(0, "a")], 100)
        tuner.observe([(0, "b")], 100)
    assert tuner.samples == 0
    clock[0] += 1.0
    tuner.observe([(0, "a")], 100)
    assert tuner.samples == 1
    assert tuner.optimizer.scores == [pytest.approx(600 / 3.0)]


def test_link_applies_a_setting_once_and_drops_its_field_when_final():
    tuner = make_tuner(samples=1)
    root, other = TuningLink(START, tuner), TuningLink(START)
    assert other.outgoing() is None and root.outgoing() == to_words(START, False)
    assert root.receive(root.outgoing(), 1) is None  # unchanged: nothing to apply
    tuner.setting, tuner.finished = BEST, True
    words = root.outgoing()
    for link in (root, other):
        assert link.receive(words, 7) == BEST
        assert link.history == [(7, BEST)] and link.words == 0
        assert link.receive(words, 8) is None


def test_autotune_knobs_parse_with_both_names_and_must_agree():
    cfg = config.read_config(
        {
            "HOROVOD_AUTOTUNE": "1",
            "HOROVOD_AUTOTUNE_LOG": "a.csv",
            "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
            "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "4",
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "9",
            "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
            "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.25",
        }
    )
    assert (
        cfg.autotune,
        cfg.autotune_log,
        cfg.autotune_warmup_samples,
        cfg.autotune_steps_per_sample,
        cfg.autotune_bayes_opt_max_samples,
        cfg.autotune_gaussian_process_noise,
    ) == (True, "a.csv", 0, 4, 7, 0.25)
    default = config.read_config({})
    assert (
        default.autotune,
        default.autotune_warmup_samples,
        default.autotune_steps_per_sample,
        default.autotune_bayes_opt_max_samples,
        default.autotune_gaussian_process_noise,
    ) == (False, 3, 10, 20, 0.8)
    lines = config.disagreements([config.agreed_values(cfg), config.agreed_values(default)])
    assert any(line.startswith("HVDLITE_AUTOTUNE differs") for line in lines)
    assert not any("AUTOTUNE_LOG" in line for line in lines)  # only rank 0 writes it


@pytest.mark.parametrize(
    "variable,value,expected",
    [
        ("HVDLITE_AUTOTUNE", "maybe", "0 or 1"),
        ("HVDLITE_AUTOTUNE_WARMUP_SAMPLES", "-1", ">= 0"),
        ("HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE", "0", ">= 1"),
        ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0", ">= 1"),
        ("HVDLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0", "more than 0"),
        ("HVDLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "nan", "finite"),
    ],
)
def test_bad_autotune_knobs_name_the_variable(variable, value, expected):
    with pytest.raises(ValueError) as info:
        config.read_config({variable: value})
    message = str(info.value)
    assert "AUTOTUNE" in message and expected in message


def test_without_scikit_learn_autotune_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
    for call in (
        require_scikit_learn,
        lambda: prepare(config.read_config({"HVDLITE_AUTOTUNE": "1"}), 0),
        lambda: BayesianOptimizer(np.zeros((2, 2))),
    ):
        with pytest.raises(ImportError) as info:
            call()
        assert "pip install scikit-learn" in str(info.value)
        assert "hvdlite[autotune]" in str(info.value)


def test_prepare_opens_the_log_on_rank_0_only(tmp_path):
    cfg = config.read_config(
        {"HVDLITE_AUTOTUNE": "1", "HVDLITE_AUTOTUNE_LOG": str(tmp_path / "log.csv")}
    )
    assert prepare(cfg, 1) is None and not (tmp_path / "log.csv").exists()
    log = prepare(cfg, 0)
    log.close()
    assert (tmp_path / "log.csv").read_text().startswith("sample,phase,fusion_threshold_bytes")
    bad = config.read_config(
        {"HVDLITE_AUTOTUNE": "1", "HVDLITE_AUTOTUNE_LOG": str(tmp_path / "no" / "such" / "dir.csv")}
    )
    with pytest.raises(OSError) as info:
        prepare(bad, 0)
    assert "HVDLITE_AUTOTUNE_LOG" in str(info.value)


def test_rank_0_says_in_one_line_what_autotune_settled_on(caplog):
    import logging

    hvdlite_log = logging.getLogger("hvdlite")
    level = hvdlite_log.level
    caplog.handler.setLevel(logging.NOTSET)  # what reaches a handler: what the user sees

    def settled_lines(shown_level):
        caplog.clear()
        hvdlite_log.setLevel(shown_level)
        clock = [0.0]
        tuner = make_tuner(warmup=0, steps=2, samples=3, clock=clock)
        run_tuner(tuner, clock)
        assert tuner.finished
        lines = [r.getMessage() for r in caplog.records if "autotune settled" in r.getMessage()]
        return tuner, lines

    try:
        tuner, lines = settled_lines(logging.WARNING)  # the default level
        assert len(lines) == 1 and "\n" not in lines[0]
        assert tuner.setting.describe() in lines[0] and "after 3 samples" in lines[0]
        assert "the best single sample" in lines[0]
        assert settled_lines(logging.ERROR)[1] == []  # errors only: quiet
    finally:
        hvdlite_log.setLevel(level)


@pytest.mark.parametrize(
    "nodes, offered",
    [
        ([(0, 1), (2, 3)], True),  # two hosts of two ranks: one link per host
        ([(0, 1), (2,)], True),  # node sizes differ: the leaders cross
        ([(0, 1, 2, 3)], False),  # one node: the two levels run as one
        ([(0,), (1,), (2,), (3,)], False),  # a rank per node: nothing to sum in the node
        (None, False),  # no two-level helper
    ],
    ids=["2x2", "2+1", "one-node", "a-rank-per-node", "no-helper"],
)
def test_hierarchical_allreduce_is_tuned_where_two_levels_can_save_the_link(nodes, offered):
    """Offered whether or not the knob was set: with Compression.fp16 or .bf16 the
    two levels still move 16 bits across hosts, one node partial per node."""
    from types import SimpleNamespace

    from hvdlite.autotune import tuning_for, two_levels_worth_trying
    from hvdlite.engine.transports.routes import Router

    require_scikit_learn()
    size = 4 if nodes is None else sum(len(n) for n in nodes)
    node_of = [0] * size if nodes is None else [n[0] for n in nodes for _ in n]
    router = Router(size, [0, 1], True, False, False, node_of=node_of)
    helper = None if nodes is None else SimpleNamespace(nodes=nodes)
    cfg = config.read_config({"HVDLITE_AUTOTUNE": "1"})
    link = tuning_for(cfg, 0, size, router, helper)
    assert ("hierarchical_allreduce" in link.tuner.space.switches) == offered
    assert {s.hierarchical_allreduce for s in link.tuner.space.settings} == (
        {False, True} if offered else {False}
    )
    if nodes is not None:
        assert two_levels_worth_trying(len(n) for n in nodes) == offered
    assert tuning_for(cfg, 1, size, router, helper).tuner is None  # rank 0 decides
