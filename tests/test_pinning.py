"""Where ranks are pinned: topology read from sysfs (a fake tree per machine shape) and
the blocks each rank gets (ranks.rank_blocks), on SMT and NUMA machines."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from workflow_scripts import study, sysinfo
from workflow_scripts.rank.distributed import ranks


def fake_sysfs(root: Path, cores: dict[int, tuple[int, int, int]], nodes: bool = True):
    """A sysfs tree: ``cores`` maps each CPU to (NUMA node, package, core)."""
    cpu_root, node_root = root / "cpu", root / "node"
    for cpu, (_node, package, core) in cores.items():
        topo = cpu_root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    if nodes:
        for node in sorted({n for n, _, _ in cores.values()}):
            folder = node_root / f"node{node}"
            folder.mkdir(parents=True)
            cpus = [c for c, (n, _, _) in cores.items() if n == node]
            (folder / "cpulist").write_text(sysinfo.cpu_list_str(cpus) + "\n")
    return sysinfo.cpu_topology(cpu_root, node_root)


def smt_machine(tmp_path, cores=4):
    """Intel's numbering of an SMT-2 machine (the article's c7i.2xlarge: 4 cores, 8
    vCPUs): CPU c and c + cores are the two threads of core c."""
    return fake_sysfs(tmp_path, {c: (0, 0, c % cores) for c in range(2 * cores)})


def blocks(topo, ranks_, per_rank, cpus=None):
    cpus = sorted(topo) if cpus is None else cpus
    return ranks.rank_blocks(cpus, ranks_, per_rank, topo)


def test_sysfs_is_read_into_node_package_core(tmp_path):
    topo = fake_sysfs(tmp_path, {0: (0, 0, 0), 1: (0, 0, 1), 2: (1, 1, 0), 3: (1, 1, 1)})
    assert topo == {0: (0, 0, 0), 1: (0, 0, 1), 2: (1, 1, 0), 3: (1, 1, 1)}
    # no NUMA folder: everything on node 0; a CPU without topology is left out
    bare = fake_sysfs(tmp_path / "bare", {0: (0, 0, 0), 1: (0, 0, 1)}, nodes=False)
    (tmp_path / "bare" / "cpu" / "cpu7").mkdir()
    assert sysinfo.cpu_topology(tmp_path / "bare" / "cpu", tmp_path / "bare" / "node") == bare
    assert bare == {0: (0, 0, 0), 1: (0, 0, 1)}
    assert sysinfo.cpu_topology(tmp_path / "none", tmp_path / "none") == {}


def test_this_machine_reads_a_topology_for_every_allowed_cpu():
    topo = sysinfo.cpu_topology()
    assert set(sysinfo.allowed_cpus()) <= set(topo)


def test_smt_ranks_never_share_a_core(tmp_path):
    topo = smt_machine(tmp_path)
    # 2 ranks x 4 threads on 4 cores x 2 threads: consecutive CPU ids would put rank 1
    # on rank 0's siblings (0-3 | 4-7); each rank gets two whole cores instead
    assert blocks(topo, 2, 4) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # fewer threads than cores: one thread per physical core first
    assert blocks(topo, 2, 2) == [[0, 1], [2, 3]]
    assert blocks(topo, 4, 1) == [[0], [1], [2], [3]]
    assert blocks(topo, 4, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert blocks(topo, 1, 6) == [[0, 1, 2, 3, 4, 5]]
    for n, per in [(2, 4), (2, 2), (4, 2), (2, 3), (3, 2)]:
        got = blocks(topo, n, per)
        cores = [{topo[c][2] for c in b} for b in got]
        assert all(len(b) == per for b in got)
        assert all(not (a & b) for a, b in itertools.combinations(cores, 2)), (n, per, got)


def test_numa_blocks_stay_inside_a_node(tmp_path):
    # two nodes of 4 cores, numbered alternately (node 0: even CPUs, node 1: odd)
    topo = fake_sysfs(tmp_path, {c: (c % 2, c % 2, c // 2) for c in range(8)})
    assert blocks(topo, 2, 4) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert blocks(topo, 4, 2) == [[0, 2], [4, 6], [1, 3], [5, 7]]
    # 3 ranks x 2 on 2 x 3 cores: one block fits in each node, the third spans both
    topo3 = fake_sysfs(tmp_path / "3", {c: (c // 3, c // 3, c % 3) for c in range(6)})
    got = blocks(topo3, 3, 2)
    assert got[:2] == [[0, 1], [3, 4]] and got[2] == [2, 5]
    nodes = [ranks.placement(b, topo3)["numa_nodes"] for b in got]
    assert nodes == [[0], [1], [0, 1]]


def test_without_smt_or_numa_blocks_are_consecutive(tmp_path):
    topo = fake_sysfs(tmp_path, {c: (0, 0, c) for c in range(6)})
    for n, per in [(2, 3), (3, 2), (6, 1), (2, 1), (2, 2)]:
        assert blocks(topo, n, per) == [list(range(r * per, (r + 1) * per)) for r in range(n)]
    # unknown topology: the old consecutive blocks
    assert ranks.rank_blocks([0, 1, 2, 3], 2, 2, {}) == [[0, 1], [2, 3]]


def test_more_ranks_than_cores_keep_siblings_together(tmp_path):
    topo = smt_machine(tmp_path, cores=2)  # 0,2 and 1,3 are siblings
    assert blocks(topo, 4, 1) == [[0], [2], [1], [3]]


def test_a_spec_cpu_list_is_placed_on_the_topology(tmp_path):
    topo = smt_machine(tmp_path)
    spec = {"cpus": "0-3", "threads": None}  # four threads of four cores, no siblings
    assert [ranks.rank_cpus(spec, r, 2, [], topo) for r in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="3 ranks x 2 threads need 6 CPUs"):
        ranks.rank_cpus({"cpus": "0-3", "threads": 2}, 0, 3, [], topo)


def test_placement_says_which_cores_and_siblings(tmp_path):
    topo = smt_machine(tmp_path)
    assert ranks.placement([0, 1, 4, 5], topo) == {
        "cores": ["0:0", "0:1"], "numa_nodes": [0], "cores_with_two_threads": 2,
    }  # fmt: skip
    assert ranks.placement([0, 1], topo)["cores_with_two_threads"] == 0
    assert ranks.placement([0, 99], topo)["cores"] is None


def test_a_reserved_comm_cpu_is_the_blocks_last_a_sibling_on_smt(tmp_path):
    """comm_cpu takes the last CPU of a rank's block: on an SMT machine the second thread
    of a core whose first thread computes, so the compute keeps its physical cores."""
    topo = smt_machine(tmp_path)
    block = blocks(topo, 2, 4)[1]
    assert block == [2, 3, 6, 7]
    compute, comm = ranks.reserve_comm_cpu(block)
    assert (compute, comm) == ([2, 3, 6], 7) and topo[7][2] == topo[3][2]
    with pytest.raises(ValueError, match="2 CPUs or more"):
        ranks.reserve_comm_cpu([5])


DDP = {"launcher": "torchrun", "dist_backend": "ccl", "ccl_worker_offload": True}


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {**DDP, "dist_backend": "gloo", "ccl_worker_offload": False, "comm_cpu": True},
            "comm_cpu True needs dist_backend 'ccl'",
        ),  # fmt: skip
        ({**DDP, "ccl_worker_offload": False, "comm_cpu": True}, "needs ccl_worker_offload true"),
        ({**DDP, "ranks": 2, "threads": 1, "comm_cpu": True}, r"threads >= 2 per rank \(.*got 1"),
        ({"comm_cpu": True}, "comm_cpu true needs launcher .torchrun."),
    ],
)
def test_a_comm_cpu_that_cannot_be_reserved_is_refused(fields, message):
    with pytest.raises(study.StudyConfigError, match=message):
        study.load_study({"groups": {"g": {"runs": [{"id": "a", **fields}]}}})


def test_multi_threaded_layouts_have_two_threads_a_rank_or_none():
    sweep = {"name": "c", "layouts": "multi-threaded", "cpus": "0-7", **DDP, "comm_cpu": True}
    s = study.load_study({"groups": {"g": {"runs": [sweep]}}})
    assert s.ids == ["c-r2-t4", "c-r4-t2"]
    small = study.load_study({"groups": {"g": {"runs": [{**sweep, "cpus": "0-1"}, {"id": "x"}]}}})
    assert small.ids == ["x"]  # 2 CPUs hold no such layout: the rest of the study runs
