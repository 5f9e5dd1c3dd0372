"""Unit tests: host lists (-H), hostfiles, SLURM node lists and tasks per node."""

import pytest

from hvdlite.runner import slurm
from hvdlite.runner.errors import UsageError
from hvdlite.runner.hosts import (
    Host,
    all_local,
    format_hosts,
    parse_hostfile,
    parse_hosts,
    rank_hosts,
    read_hostfile,
    total_slots,
    used_hosts,
)


def test_parse_hosts_with_and_without_slots():
    hosts = parse_hosts("node1:2,node2:4, node-3.cluster ,10.0.0.5:1")
    assert hosts == [
        Host("node1", 2),
        Host("node2", 4),
        Host("node-3.cluster", 1),
        Host("10.0.0.5", 1),
    ]
    assert total_slots(hosts) == 8
    assert format_hosts(hosts) == "node1:2,node2:4,node-3.cluster:1,10.0.0.5:1"


@pytest.mark.parametrize(
    "text",
    ["", "a:2,", ",a", "a:0", "a:-1", "a:x", "a:2:3", "bad host", "a:2,a:1", "a:", "[a]:2", "-a:1"],
)
def test_parse_hosts_rejects(text):
    with pytest.raises(UsageError) as info:
        parse_hosts(text)
    assert "\n" not in str(info.value)


def test_parse_hostfile_formats():
    text = """
    # a comment
    node1 slots=2
    node2 slots=4 max_slots=8   # trailing comment
    node3
    node4:3
    """
    assert parse_hostfile(text) == [
        Host("node1", 2),
        Host("node2", 4),
        Host("node3", 1),
        Host("node4", 3),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "node1 slots=x",
        "node1 cpus=2",
        "node1 slots=0",
        "# only a comment\n",
        "node1\nnode1 slots=2",
    ],
)
def test_parse_hostfile_rejects(text):
    with pytest.raises(UsageError):
        parse_hostfile(text)


def test_read_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb slots=2\n")
    assert read_hostfile(str(path)) == [Host("a", 2), Host("b", 2)]
    with pytest.raises(UsageError, match="cannot read"):
        read_hostfile(str(tmp_path / "missing"))


def test_used_hosts_fills_in_order():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 2)]
    assert used_hosts(hosts, 3) == [Host("a", 2), Host("b", 1)]
    assert used_hosts(hosts, 6) == hosts


def test_rank_hosts_places_ranks_as_the_launchers_do():
    hosts = [Host("a", 1), Host("b", 1), Host("c", 2)]
    assert rank_hosts(hosts) == {0: "a", 1: "b", 2: "c", 3: "c"}
    assert rank_hosts(hosts, 3) == {0: "a", 1: "b", 2: "c"}


def test_all_local():
    assert all_local([Host("localhost", 4)])
    assert not all_local([Host("localhost", 2), Host("elsewhere-node", 2)])
    assert not all_local([Host("elsewhere-node", 2)])


@pytest.mark.parametrize(
    "text,expected",
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a[1-2],b,c[9-11]", ["a1", "a2", "b", "c9", "c10", "c11"]),
        ("gpu-[008-010]-ib", ["gpu-008-ib", "gpu-009-ib", "gpu-010-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[5]", ["x5"]),
        ("login1,node[1,3]", ["login1", "node1", "node3"]),
    ],
)
def test_expand_nodelist(text, expected):
    assert slurm.expand_nodelist(text) == expected


@pytest.mark.parametrize(
    "text", ["", "node[1-", "node]1", "node[a-b]", "node[3-1]", "node[[1]]", "a,,b"]
)
def test_expand_nodelist_rejects(text):
    with pytest.raises(UsageError):
        slurm.expand_nodelist(text)


@pytest.mark.parametrize(
    "text,expected",
    [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,2,3", [1, 2, 3])],
)
def test_expand_tasks_per_node(text, expected):
    assert slurm.expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "2(x)", "x2", "2(3)", "2,"])
def test_expand_tasks_per_node_rejects(text):
    with pytest.raises(UsageError):
        slurm.expand_tasks_per_node(text)


def test_allocation_hosts():
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[01-03],big",
        "SLURM_TASKS_PER_NODE": "2(x3),4",
    }
    assert slurm.in_allocation(env)
    assert slurm.allocation_hosts(env) == [
        Host("node01", 2),
        Host("node02", 2),
        Host("node03", 2),
        Host("big", 4),
    ]


def test_allocation_hosts_mismatch_and_missing():
    with pytest.raises(UsageError, match="3 nodes"):
        slurm.allocation_hosts(
            {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2"}
        )
    with pytest.raises(UsageError, match="SLURM_TASKS_PER_NODE"):
        slurm.allocation_hosts({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"})
    assert not slurm.in_allocation({})
