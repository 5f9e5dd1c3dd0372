"""Elastic training, in one process: the commit file, states, run, options, hosts.

Real jobs (ranks killed, hosts changing) are in tests/test_elastic_jobs.py.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys

import pytest

from hvdlite.elastic import ObjectState, State, run
from hvdlite.elastic import layout
from hvdlite.elastic import persistence
from hvdlite.elastic.persistence import CommitStore, ElasticStateError
from hvdlite.elastic.writer import dump
from hvdlite.exceptions import HostsUpdatedInterrupt
from hvdlite.runner import cli, configfile, options
from hvdlite.runner.blacklist import Blacklist
from hvdlite.runner.discovery import (
    DiscoveryError,
    FixedHosts,
    ScriptDiscovery,
    node_usable,
    parse_discovered,
)
from hvdlite.runner.elastic_hosts import HostPool, describe_change, rank_host
from hvdlite.runner.elastic_settings import settings_from
from hvdlite.runner.errors import UsageError
from hvdlite.runner.hosts import Host

PY = sys.executable
pytestmark = pytest.mark.timeout(60)


# -- the commit file ----------------------------------------------------------------------
def test_commit_round_trip_and_overwrite(tmp_path):
    store = CommitStore(str(tmp_path / "state"), "job1")
    assert store.read() is None
    store.write(b"first", 1, 2, {"epoch": 0})
    store.write(b"second", 2, 3, {"epoch": 1, "batch": 4})
    commit = store.read()
    assert (commit.payload, commit.number, commit.size) == (b"second", 2, 3)
    assert commit.describe() == "commit 2 (epoch=1, batch=4)"
    assert sorted(os.listdir(tmp_path)) == ["state", "state.spare"]


def test_each_commit_is_written_in_place_into_the_one_before_last(tmp_path):
    store = CommitStore(str(tmp_path / "state"), "job1")
    store.write(b"a" * 100, 1, 2)
    first = os.stat(tmp_path / "state").st_ino
    store.write(b"b" * 100, 2, 2)
    assert os.stat(tmp_path / "state.spare").st_ino == first  # kept for the next write
    second = os.stat(tmp_path / "state").st_ino
    store.write(b"c", 3, 2)  # shorter: the file is cut to its new length
    assert os.stat(tmp_path / "state").st_ino == first
    assert os.stat(tmp_path / "state.spare").st_ino == second
    commit = store.read()
    assert (commit.payload, commit.number) == (b"c", 3)


def test_a_crash_before_the_rename_keeps_the_previous_commit(tmp_path, monkeypatch):
    store = CommitStore(str(tmp_path / "state"), "job1")
    store.write(b"good", 1, 2)

    def crash(temporary, final):
        assert open(temporary, "rb").read().endswith(b"newer")  # fully written first
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(persistence, "_publish", crash)
    with pytest.raises(KeyboardInterrupt):
        store.write(b"newer", 2, 2)
    assert store.read().payload == b"good"
    monkeypatch.undo()
    store.write(b"newest", 3, 2)  # the next commit overwrites what the crash left
    assert store.read().number == 3
    assert sorted(os.listdir(tmp_path)) == ["state", "state.spare"]


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda data: b"garbage" + data, "does not start with the hvdlite state header"),
        (lambda data: data[:-2], "holds 5 bytes of state, its header says 7"),
        (lambda data: data[:-1] + b"X", "the checksum of its state does not match"),
        (lambda data: persistence.MAGIC + b"{not json\npayload", "its header is not valid"),
        (lambda data: persistence.MAGIC + b"x" * 70000, "its header line is cut short"),
    ],
)
def test_a_corrupt_commit_is_a_clear_error(tmp_path, damage, why):
    path = tmp_path / "state"
    CommitStore(str(path), "job1").write(b"payload", 1, 2)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ElasticStateError) as info:
        CommitStore(str(path), "job1").read()
    message = str(info.value)
    assert why in message and str(path) in message and "start the job again" in message


def test_format_1_files_still_read_and_unknown_formats_are_named(tmp_path):
    import json
    import zlib

    path = tmp_path / "state"
    header = {
        "job": "j",
        "commit": 4,
        "size": 2,
        "time": 0.0,
        "summary": {"epoch": 1},
        "bytes": 7,
        "crc32": zlib.crc32(b"payload"),
    }
    v1 = b"HVDLITE-ELASTIC-STATE 1\n" + json.dumps(header).encode() + b"\n"
    path.write_bytes(v1 + b"payload")
    commit = CommitStore(str(path), "j").read()
    assert (commit.number, commit.payload) == (4, b"payload")
    path.write_bytes(v1 + b"paXload")
    with pytest.raises(ElasticStateError, match="the checksum of its state does not match"):
        CommitStore(str(path), "j").read()
    path.write_bytes(b"HVDLITE-ELASTIC-STATE 9\n{}\n")
    with pytest.raises(
        ElasticStateError, match="has the format '9', which this hvdlite does not read"
    ):
        CommitStore(str(path), "j").read()


def test_the_checksum_sees_one_word_changed_and_words_swapped():
    from hvdlite.elastic.checksum import state_sum

    data = bytearray(range(256)) * 1000 + b"tail"
    base = state_sum([bytes(data)])
    for offset, bit in ((0, 0), (7, 7), (80_000, 3), (len(data) - 1, 1)):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << bit
        assert state_sum([bytes(damaged)]) != base
    swapped = bytearray(data)
    swapped[0:8], swapped[8:16] = data[8:16], data[0:8]
    assert state_sum([bytes(swapped)]) != base
    assert state_sum([b"ab", b"c"]) != state_sum([b"abc"])  # parts are padded apart


def test_tensors_and_arrays_travel_beside_the_pickle(tmp_path):
    torch = pytest.importorskip("torch")
    import numpy as np

    state = {
        "w": torch.arange(6.0).view(2, 3),
        "b": torch.ones(3, dtype=torch.bfloat16),
        "view": torch.arange(10)[2:5],
        "a": np.full(4, 7, np.int32),
        "step": 3,
    }
    store = CommitStore(str(tmp_path / "state"), "j")
    parts = dump(state)
    assert len(parts) == 4  # the pickle, then w, view and a out of band (bf16 in band)
    store.write(parts, 1, 2)
    back = store.read().load()
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
    assert torch.equal(back["view"], torch.tensor([2, 3, 4])) and back["step"] == 3
    assert back["a"].tolist() == [7] * 4
    back["w"] += 1  # loaded tensors are writable (made on a private copy of the file)


def test_another_jobs_commit_is_refused(tmp_path):
    CommitStore(str(tmp_path / "state"), "job1").write(b"x", 1, 1)
    with pytest.raises(ElasticStateError, match="belongs to job 'job1'"):
        CommitStore(str(tmp_path / "state"), "job2").read()


# -- the worker's context and the files it shares with hvdrun -------------------------------
def test_worker_context_from_hvdruns_variables(tmp_path):
    assert not layout.WorkerContext.from_environ({}).relaunchable
    ctx = layout.WorkerContext.from_environ(
        {
            layout.JOB_DIR_VARIABLE: str(tmp_path),
            layout.JOB_ID_VARIABLE: "j",
            layout.GENERATION_VARIABLE: "2",
            layout.EXPECT_COMMIT_VARIABLE: "5",
        }
    )
    assert (ctx.relaunchable, ctx.generation, ctx.expect_commit) == (True, 2, 5)
    with pytest.raises(ValueError, match="HVDLITE_ELASTIC_GENERATION='x' is not a whole"):
        layout.WorkerContext.from_environ(
            {layout.JOB_DIR_VARIABLE: "d", layout.GENERATION_VARIABLE: "x"}
        )
    assert layout.read_notice(str(tmp_path), 2) is None
    layout.post_notice(str(tmp_path), 2, "h1:2 -> h1:2,h2:1")
    assert layout.read_notice(str(tmp_path), 2) == "h1:2 -> h1:2,h2:1"
    assert layout.read_notice(str(tmp_path), 3) is None  # another launch's notice


# -- states and run, one rank (broadcast is the identity) -----------------------------------
def _elastic_env(monkeypatch, tmp_path, generation=0, expect=0):
    for name, value in {
        layout.JOB_DIR_VARIABLE: str(tmp_path),
        layout.JOB_ID_VARIABLE: "j",
        layout.GENERATION_VARIABLE: str(generation),
        layout.EXPECT_COMMIT_VARIABLE: str(expect),
    }.items():
        monkeypatch.setenv(name, value)
    layout.write_marker(str(tmp_path), "j")  # as hvdrun does


def _state(**values):
    return ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, **values)


def test_object_state_save_restore_sync():
    state = _state(epoch=0, batch=3)
    state.epoch, state.batch = 1, 7
    state.restore()
    assert (state.epoch, state.batch) == (0, 3)
    state.epoch = 2
    state.save()
    state.epoch = 9
    state.restore()
    assert state.epoch == 2
    with pytest.raises(TypeError, match="not callable"):
        state.register_reset_callbacks([3])


def test_commit_outside_elastic_mode_stays_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in (layout.JOB_DIR_VARIABLE, layout.GENERATION_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    state = _state(epoch=1)
    state.commit()
    assert os.listdir(tmp_path) == []
    state.on_hosts_updated(1.0, None)
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()


def test_commit_persists_and_a_notice_interrupts(tmp_path, monkeypatch):
    _elastic_env(monkeypatch, tmp_path)
    state = _state(epoch=1, batch=2)
    state.commit()
    state.flush()  # the write runs on a thread of its own
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    assert commit.number == 1 and commit.load() == {"objects": {"epoch": 1, "batch": 2}}
    layout.post_notice(str(tmp_path), 0, "new hosts")
    state.epoch = 2
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    state.flush()
    assert CommitStore(str(tmp_path / layout.STATE_FILE), "j").read().number == 2


def test_run_resumes_from_the_commit_and_runs_reset_callbacks(tmp_path, monkeypatch, capsys):
    _elastic_env(monkeypatch, tmp_path)
    first = _state(epoch=0)
    first.epoch = 4
    first.commit()
    first.flush()
    _elastic_env(monkeypatch, tmp_path, generation=1, expect=1)
    state, resets = _state(epoch=0), []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])
    assert run(lambda s, extra: (s.epoch, extra))(state, "x") == (4, "x")
    assert resets == [4]
    assert "resuming from commit 1 (epoch=4)" in capsys.readouterr().err


def test_hosts_updated_under_hvdrun_commits_marks_and_exits_75(tmp_path, monkeypatch):
    _elastic_env(monkeypatch, tmp_path)
    state = _state(step=0)

    @run
    def train(state):
        state.step = 3
        raise HostsUpdatedInterrupt()

    with pytest.raises(SystemExit) as info:
        train(state)
    assert info.value.code == layout.HOSTS_UPDATED_EXIT == 75
    assert os.path.exists(layout.restart_path(str(tmp_path), 0))
    saved = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    assert saved.load()["objects"] == {"step": 3}


def test_hosts_updated_outside_hvdrun_resets_and_runs_again(monkeypatch):
    monkeypatch.delenv(layout.JOB_DIR_VARIABLE, raising=False)
    state, calls, resets = _state(n=0), [], []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @run
    def train(state):
        calls.append(state.n)
        if len(calls) == 1:
            raise HostsUpdatedInterrupt()
        return "done"

    assert train(state) == "done" and calls == [0, 0] and resets == [1]


@pytest.mark.parametrize(
    "setup,why",
    [
        ("missing", "is missing, but hvdrun saw commit 2 there"),
        ("older", "holds commit 1, but hvdrun saw commit 2"),
        ("unpicklable", "cannot be unpickled"),
        ("corrupt", "is corrupt"),
        ("other-attributes", "has no value for ['lr']"),
    ],
)
def test_a_commit_that_cannot_be_resumed_ends_every_rank_with_76(
    tmp_path, monkeypatch, capsys, setup, why
):
    store = CommitStore(str(tmp_path / layout.STATE_FILE), "j")
    if setup == "older":
        store.write(pickle.dumps({"objects": {"lr": 1}}), 1, 1)
    elif setup == "unpicklable":
        store.write(b"\x80\x05not a pickle", 2, 1)
    elif setup == "corrupt":
        store.write(pickle.dumps({"objects": {"lr": 1}}), 2, 1)
        (tmp_path / layout.STATE_FILE).write_bytes(b"HVDLITE")
    elif setup == "other-attributes":
        store.write(pickle.dumps({"objects": {"epoch": 1}}), 2, 1)
    _elastic_env(monkeypatch, tmp_path, generation=1, expect=2)
    with pytest.raises(SystemExit) as info:
        run(lambda s: None)(_state(lr=0.1))
    assert info.value.code == layout.STATE_ERROR_EXIT == 76
    assert why in capsys.readouterr().err


def test_run_needs_a_state_first():
    with pytest.raises(TypeError, match="must be an elastic State"):
        run(lambda s: None)({"epoch": 0})
    with pytest.raises(NotImplementedError):
        State(bcast_object=lambda o: o, get_rank=lambda: 0).save()


# -- ElasticSampler (torch) -----------------------------------------------------------------
def test_elastic_sampler_resumes_across_sizes_without_repeats(monkeypatch):
    pytest.importorskip("torch")
    from hvdlite.torch.elastic import sampler as sampler_module

    world = {"size": 2, "rank": 0}
    monkeypatch.setattr(sampler_module, "size", lambda: world["size"])
    monkeypatch.setattr(sampler_module, "rank", lambda: world["rank"])

    def shares(sampler):
        out = []
        for rank in range(world["size"]):
            world["rank"] = rank
            sampler.reset()
            out.append(list(sampler))
        return out

    sampler = sampler_module.ElasticSampler(list(range(24)), shuffle=True, seed=3)
    first = shares(sampler)
    assert sorted(sum(first, [])) == list(range(24)) and len(sampler) == 12
    done = [i for share in first for i in share[:3]]  # 3 batches of 1 per rank
    for batch in range(3):
        sampler.record_batch(batch, 1)
    saved = sampler.state_dict()
    world["size"] = 3
    sampler = sampler_module.ElasticSampler(list(range(24)), shuffle=True, seed=3)
    sampler.load_state_dict(saved)
    rest = shares(sampler)
    assert sorted(done + sum(rest, [])) == list(range(24))
    sampler.set_epoch(1)
    assert shares(sampler) != first  # a new order each epoch
    world["size"] = 5  # 24 do not divide among 5: the first ones repeat at the end
    assert len(sum(shares(sampler), [])) == 25


def test_torch_state_commits_model_optimizer_and_values(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd

    _elastic_env(monkeypatch, tmp_path)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=2)
    state._rank = lambda: 0
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state.save()
    state._persist()  # commit() without its host check (which broadcasts)
    state.flush()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    state.restore()
    assert torch.equal(model.weight, trained["weight"])
    saved = state._handlers["optimizer"].saved["state"][0]["momentum_buffer"]
    live = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(live, saved) and live.data_ptr() != saved.data_ptr()  # not aliased
    state.save()  # into the same buffers again
    assert state._handlers["optimizer"].saved["state"][0]["momentum_buffer"] is saved
    fresh_model = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.SGD(fresh_model.parameters(), lr=0.1, momentum=0.9)
    fresh = hvd.elastic.TorchState(fresh_model, fresh_opt, epoch=0)
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    fresh._load_snapshot(commit.load())
    assert fresh.epoch == 2 and torch.equal(fresh_model.weight, trained["weight"])
    assert fresh_opt.state_dict()["state"]  # the momentum buffers came back
    other = hvd.elastic.TorchState(torch.nn.Linear(3, 2), sampler_free=1)
    with pytest.raises(ElasticStateError, match="build the state with the same keyword"):
        other._load_snapshot(commit.load())


def test_rank_0_commits_torch_state_without_a_copy_and_restores_from_the_file(
    tmp_path, monkeypatch
):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd

    _elastic_env(monkeypatch, tmp_path)
    for name in ("HVDLITE_ELASTIC_SYNC_COMMIT", "HVDLITE_ELASTIC_BACKGROUND_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    state._rank, state._bcast_object = (lambda: 0), (lambda obj: obj)  # one rank, no MPI

    def train():
        optimizer.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()

    train()
    state.epoch = 1
    state.commit()
    assert all(handler.in_commit for handler in state._handlers.values())
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    train()
    state.epoch = 2
    state.restore()
    assert state.epoch == 1
    assert all(torch.equal(v, committed[k]) for k, v in model.state_dict().items())
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert not any(handler.in_commit for handler in state._handlers.values())
    state.commit()
    CommitStore(str(tmp_path / layout.STATE_FILE), "j").write(dump({"other": 1}), 9, 1)
    with pytest.raises(ElasticStateError, match="needs commit 2 .* holds commit 9"):
        state.restore()


def test_tensorflow_state_commits_variables_and_values(tmp_path, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    import hvdlite.tensorflow as hvd

    _elastic_env(monkeypatch, tmp_path)
    weights = [tf.Variable([[1.0, 2.0]]), tf.Variable([3.0])]
    state = hvd.elastic.TensorFlowState(weights, step=4)
    state._rank = lambda: 0
    weights[0].assign([[5.0, 6.0]])
    state.save()
    state._persist()  # commit() without its host check (which broadcasts)
    state.flush()
    weights[0].assign([[0.0, 0.0]])
    state.restore()
    assert weights[0].numpy().tolist() == [[5.0, 6.0]]
    fresh_weights = [tf.Variable([[0.0, 0.0]]), tf.Variable([0.0])]
    fresh = hvd.elastic.TensorFlowState(fresh_weights, step=0)
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    fresh._load_snapshot(commit.load())
    assert fresh.step == 4 and fresh_weights[0].numpy().tolist() == [[5.0, 6.0]]
    with pytest.raises(ElasticStateError, match="holds 2 tracked variables, this process has 3"):
        three = hvd.elastic.TensorFlowState([tf.Variable(0.0)] * 3, step=0)
        three._load_snapshot(commit.load())
    with pytest.raises(ValueError, match="pass the variables to track"):
        hvd.elastic.TensorFlowState([])


# -- hvdrun's options ------------------------------------------------------------------------
def _settings(argv, environ=None):
    args, values = cli.parse([*argv, PY])
    return settings_from(values, {"PATH": os.environ["PATH"], **(environ or {})})


def test_elastic_settings_defaults(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert _settings(["-np", "2"]) is None
    fixed = _settings(["-np", "4", "--max-restarts", "3"])
    assert (fixed.source, fixed.min_np, fixed.max_np, fixed.max_restarts) == ("fixed", 4, 4, 3)
    found = _settings(
        ["--host-discovery-script", str(script), "--min-np", "2"], {"HOROVOD_ELASTIC_TIMEOUT": "7"}
    )
    assert (found.source, found.min_np, found.max_np, found.max_restarts, found.timeout) == (
        "script",
        2,
        None,
        None,
        7.0,
    )
    assert found.state_dir == os.path.abspath(".hvdlite-elastic")
    ranged = _settings(
        [
            "--host-discovery-script",
            str(script),
            "-np",
            "3",
            "--max-np",
            "5",
            "--blacklist-cooldown-range",
            "1",
            "8",
            "--elastic-state-dir",
            "st",
            "--reset-limit",
            "2",
            "--slots-per-host",
            "4",
        ],
        {"HVDLITE_ELASTIC_DISCOVERY_INTERVAL": "0.1"},
    )
    assert (
        ranged.min_np,
        ranged.max_np,
        ranged.cooldown_range,
        ranged.reset_limit,
        ranged.slots_per_host,
        ranged.poll_interval,
    ) == (3, 5, (1.0, 8.0), 2, 4, 0.1)
    assert _settings(["--max-restarts", "1"], {"SLURM_JOB_ID": "7"}).source == "slurm"


@pytest.mark.parametrize(
    "argv,environ,message",
    [
        (["-np", "2", "--reset-limit", "3"], {}, "--reset-limit only apply to elastic jobs"),
        (["-np", "2", "--min-np", "1"], {}, "--min-np/--max-np need hosts that can change"),
        (
            ["-np", "2", "--elastic-background-commit"],
            {},
            "--elastic-background-commit only apply to elastic jobs",
        ),
        (["-np", "2", "--max-restarts", "1", "--slots-per-host", "2"], {}, "--slots-per-host"),
        (
            ["--host-discovery-script", "SCRIPT", "--min-np", "3", "--max-np", "2"],
            {},
            "--min-np 3 is more than --max-np 2",
        ),
        (
            ["--host-discovery-script", "SCRIPT", "-np", "1", "--min-np", "2"],
            {},
            "-np 1 is less than --min-np 2",
        ),
        (
            ["--host-discovery-script", "SCRIPT", "-np", "5", "--max-np", "4"],
            {},
            "-np 5 is more than --max-np 4",
        ),
        (
            ["--host-discovery-script", "SCRIPT", "--blacklist-cooldown-range", "9", "2"],
            {},
            "MIN must not be more than MAX",
        ),
        (["--host-discovery-script", "SCRIPT", "-H", "a:2"], {}, "give either"),
        (["--host-discovery-script", "./no-such-script.sh"], {}, "is not an executable file"),
        (["--host-discovery-script", "no-such-program-x"], {}, "is not on PATH"),
        (
            ["--host-discovery-script", "SCRIPT"],
            {"HOROVOD_ELASTIC_TIMEOUT": "soon"},
            "HOROVOD_ELASTIC_TIMEOUT='soon' is not a number",
        ),
        (
            ["--host-discovery-script", "SCRIPT"],
            {"HVDLITE_ELASTIC_DISCOVERY_INTERVAL": "0"},
            "must be a positive number",
        ),
    ],
)
def test_elastic_option_errors(argv, environ, message, tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _settings([str(script) if a == "SCRIPT" else a for a in argv], environ)


def test_the_commit_mode_flags_set_the_ranks_variable():
    for flag, value in (("--elastic-background-commit", "1"), ("--elastic-sync-commit", "0")):
        _args, values = cli.parse(["-np", "2", "--max-restarts", "1", flag, PY])
        assert options.knob_environment(values)["HVDLITE_ELASTIC_BACKGROUND_COMMIT"] == value
    _args, values = cli.parse(["-np", "2", "--max-restarts", "1", PY])
    assert "HVDLITE_ELASTIC_BACKGROUND_COMMIT" not in options.knob_environment(values)


def test_elastic_options_in_the_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "elastic:\n  min_np: 2\n  cooldown_range: [1, 4]\n  state_dir: s\nmax-restarts: 3\n"
    )
    assert configfile.read_config_file(str(config)) == {
        "min_np": 2,
        "blacklist_cooldown_range": [1.0, 4.0],
        "elastic_state_dir": "s",
        "max_restarts": 3,
    }
    parsed = options.parse_args(["--blacklist-cooldown-range", "1", "2", PY])
    assert parsed.blacklist_cooldown_range == [1.0, 2.0]


def test_hvdrun_exits_2_on_elastic_errors(tmp_path, capsys):
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho no cluster today >&2\nexit 3\n")
    failing.chmod(0o755)
    for argv, expected in (
        (["-np", "2", "--min-np", "1"], "need hosts that can change"),
        (["--host-discovery-script", str(failing)], "exited with code 3: no cluster today"),
        (["--blacklist-cooldown-range", "1", "--max-restarts", "1"], "expected 2 arguments"),
    ):
        assert cli.main([*argv, PY]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hvdrun: error: ") and expected in err[0]


def test_dry_run_shows_the_elastic_variables(tmp_path, capsys):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho localhost:3\n")
    script.chmod(0o755)
    assert (
        cli.main(
            ["--dry-run", "--host-discovery-script", str(script), "--max-np", "2", PY, "train.py"]
        )
        == 0
    )
    line = capsys.readouterr().out
    assert " -n 2 " in line and "HVDLITE_ELASTIC_JOB_DIR=" in line and "HOROVOD_ELASTIC=1 " in line


# -- hosts: discovery, blacklist, pool --------------------------------------------------------
def test_discovery_output_parsing():
    hosts = parse_discovered("# comment\nh1:4\n\nh2\n  h3:1  # spare\n", 2, "script")
    assert hosts == [Host("h1", 4), Host("h2", 2), Host("h3", 1)]
    for text, message in (
        ("h1\nh1:2\n", "listed more than once"),
        ("h1:zero\n", "must be a positive integer"),
        ("bad host!\n", "not a valid host name"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_discovered(text, 1, "script")


def test_script_discovery_runs_a_command_without_a_shell(tmp_path):
    assert ScriptDiscovery("printf 'a:2\\nb\\n'").discover() == [Host("a", 2), Host("b", 1)]
    with pytest.raises(DiscoveryError, match="exited with code 1: oops"):
        ScriptDiscovery("sh -c 'echo oops >&2; exit 1'").discover()
    with pytest.raises(DiscoveryError, match="output line 1"):
        ScriptDiscovery("echo 'a:b'").discover()
    with pytest.raises(DiscoveryError, match="did not finish within"):
        ScriptDiscovery("sleep 5", timeout=0.2).discover()


def test_slurm_node_states():
    assert node_usable("idle") and node_usable("alloc") and node_usable("mix")
    for state in ("drain", "drng", "down", "down*", "idle*", "fail", "maint"):
        assert not node_usable(state), state


def test_blacklist_cooldown_doubles_up_to_max():
    now = [0.0]
    blacklist = Blacklist((2, 5), clock=lambda: now[0])
    assert blacklist.add("h1", "rank 0 failed") == 2
    assert blacklist.blocked("h1") and "left out for 2 s more" in blacklist.reason("h1")
    now[0] = 2.5
    assert not blacklist.blocked("h1") and blacklist.reason("h1") is None
    assert blacklist.add("h1", "again") == 4 and blacklist.add("h1", "again") == 5
    forever = Blacklist()
    assert forever.add("h2", "x") is None
    now[0] = 1e9
    assert forever.blocked("h2") and "rest of the job" in forever.reason("h2")


def test_host_pool_keeps_old_hosts_first_and_names_lost_ones():
    source = FixedHosts([Host("b", 2), Host("a", 2)], "test hosts")
    source.dynamic = True
    pool = HostPool(source, Blacklist(), max_np=3)
    hosts = pool.available()
    placement = pool.placement(hosts)
    assert placement == [Host("b", 2), Host("a", 1)]
    pool.record(placement)
    source.hosts = [Host("c", 4), Host("a", 2), Host("b", 2)]
    assert [h.name for h in pool.available()] == ["b", "a", "c"]
    pool.blacklist.add("b", "rank 1 failed there")
    source.hosts = [Host("c", 4)]
    assert pool.lost(pool.available()) == [
        "b (rank 1 failed there; left out for the rest of the job)",
        "a (no longer offered by test hosts)",
    ]
    assert rank_host(placement, 2) == "a" and rank_host(placement, 3) is None
    assert describe_change(placement, [Host("c", 3)]) == "b:2,a:1 -> c:3 (new c; gone a, b)"


def test_a_failed_background_write_is_reported_at_the_next_wait(tmp_path, monkeypatch):
    from hvdlite.elastic.writer import CommitWriter

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    writer = CommitWriter(CommitStore(str(blocker / "state"), "j"))
    writer.submit(dump({"objects": {}}), 1, 1, {})
    with pytest.raises(
        ElasticStateError, match="writing commit 1 to .*not-a-directory/state failed"
    ):
        writer.wait()
    writer.wait()  # reported once
    with pytest.raises(ElasticStateError, match="writing commit 2 to .*not-a-directory"):
        writer.write(dump({"objects": {}}), 2, 1, {})  # at once, on this thread


@pytest.mark.parametrize(
    "environ,background",
    [
        ({}, False),
        ({"HVDLITE_ELASTIC_BACKGROUND_COMMIT": "1"}, True),
        ({"HVDLITE_ELASTIC_BACKGROUND_COMMIT": "0"}, False),
        ({"HVDLITE_ELASTIC_SYNC_COMMIT": "1"}, False),
        ({"HVDLITE_ELASTIC_SYNC_COMMIT": "1", "HVDLITE_ELASTIC_BACKGROUND_COMMIT": "1"}, False),
        ({"HVDLITE_ELASTIC_SYNC_COMMIT": "0"}, True),
    ],
)
def test_commits_are_synchronous_unless_background_is_asked_for(environ, background):
    from hvdlite.elastic.writer import background_commits

    assert background_commits(environ) is background


def test_a_commit_is_on_disk_when_commit_returns(tmp_path, monkeypatch):
    _elastic_env(monkeypatch, tmp_path)
    for name in ("HVDLITE_ELASTIC_SYNC_COMMIT", "HVDLITE_ELASTIC_BACKGROUND_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    state = _state(epoch=3, history=[1])
    state.commit()
    assert state._writer._thread is None  # written on this thread, before commit() returned
    assert CommitStore(str(tmp_path / layout.STATE_FILE), "j").read().number == 1
    monkeypatch.setenv("HVDLITE_ELASTIC_BACKGROUND_COMMIT", "1")
    state = _state(epoch=4, history=[1])
    state.commit()
    state.history.append(2)  # changed while the write may still run: not in the commit
    state.flush()
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    assert commit.load() == {"objects": {"epoch": 4, "history": [1]}}


def test_slurm_source_drops_nodes_sinfo_reports_drained(tmp_path):
    from hvdlite.runner.discovery import SlurmDiscovery

    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args\nprintf "n1 alloc\\nn2 drng\\nn3 mix\\n"\n'
    )
    sinfo.chmod(0o755)
    environ = {
        "SLURM_JOB_ID": "5",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "2(x3)",
        "PATH": str(tmp_path),
    }
    assert SlurmDiscovery(environ).discover() == [Host("n1", 2), Host("n3", 2)]
    assert (tmp_path / "args").read_text().split() == [
        "-h",
        "-N",
        "-n",
        "n1,n2,n3",
        "-o",
        "%N",
        "%t",
    ]
    no_sinfo = dict(environ, PATH=str(tmp_path / "empty"))
    assert len(SlurmDiscovery(no_sinfo).discover()) == 3  # cannot ask: the whole allocation
