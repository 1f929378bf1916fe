"""ClusterEnv (hvdtrain/cluster/env.py) reads SLURM's task variables, hostlists and tasks-per-node
strings; hostlists expand with python-hostlist, or with `scontrol show hostnames` without it."""
import sys

import pytest

from hvdtrain.cluster.env import ClusterEnv, expand_hostlist, gpu_for_rank
from hvdtrain.errors import UsageError


def _srun_environ(**extra) -> dict:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "2", "SLURM_NTASKS": "11", "SLURM_NNODES": "4",
           "SLURM_JOB_NODELIST": "node[01-03],gpu7", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    env.update(extra)
    return env


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-03],gpu7", ["node01", "node02", "node03", "gpu7"]),
    ("gpu7", ["gpu7"]),
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
    ("jean-zay-iam[01,05-06]", ["jean-zay-iam01", "jean-zay-iam05", "jean-zay-iam06"]),
    ("", []),
])
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


def test_expand_hostlist_falls_back_to_scontrol(slurm_cluster, monkeypatch):
    monkeypatch.setitem(sys.modules, "hostlist", None)      # `import hostlist` now fails
    assert expand_hostlist("node[01-03],gpu7") == ["node01", "node02", "node03", "gpu7"]


def test_cluster_env_reads_an_srun_task():
    env = ClusterEnv.from_environ(_srun_environ())
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.num_nodes) == ("slurm", 9, 1, 11, 4)
    assert env.local_world_size == 3                         # node 2 of "4(x2),3"
    assert env.hosts == ["node01", "node02", "node03", "gpu7"] and env.master_addr == "node01"
    assert env.job_id == "4242" and not env.is_rank0


@pytest.mark.parametrize("tasks_per_node, node_id, local", [
    ("4(x2),3", "0", 4), ("4(x2),3", "1", 4), ("4(x2),3", "2", 3), ("2", "0", 2), ("1,2(x3)", "3", 2),
])
def test_cluster_env_tasks_per_node(tasks_per_node, node_id, local):
    env = ClusterEnv.from_environ(_srun_environ(SLURM_TASKS_PER_NODE=tasks_per_node, SLURM_NODEID=node_id))
    assert env.local_world_size == local


def test_cluster_env_refuses_a_node_past_the_tasks_per_node_list():
    with pytest.raises(UsageError, match=r"this is node 2 \(SLURM_NODEID\) of a step whose tasks per node '4\(x2\)' list 2"):
        ClusterEnv.from_environ(_srun_environ(SLURM_TASKS_PER_NODE="4(x2)", SLURM_NODEID="2"))


def test_cluster_env_prefers_the_steps_own_variables():
    """A step smaller than its job (srun -n 2 inside a 4-node allocation) has its own size and nodes."""
    env = ClusterEnv.from_environ(_srun_environ(
        SLURM_PROCID="1", SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NUM_NODES="1",
        SLURM_STEP_NODELIST="node02", SLURM_STEP_TASKS_PER_NODE="2"))
    assert (env.world_size, env.num_nodes, env.local_world_size, env.hosts) == (2, 1, 2, ["node02"])


def test_cluster_env_outside_a_step_is_not_slurm():
    """The batch shell has the job's variables but no step: one process, not rank 0 of N."""
    environ = _srun_environ()
    del environ["SLURM_STEP_ID"]
    env = ClusterEnv.from_environ(environ)
    assert env.launcher == "single" and env.world_size == 1 and env.job_id == "4242"


def test_one_gpu_per_rank_or_a_clear_refusal():
    assert [gpu_for_rank(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]
    assert gpu_for_rank(0, 1, 8) == 0
    with pytest.raises(UsageError, match=r"^4 ranks on this node but 2 visible GPU\(s\): hvdtrain runs one rank per GPU"):
        gpu_for_rank(3, 4, 2)


def test_a_rendezvous_port_is_free_and_below_the_kernels_ephemeral_range(tmp_path):
    """A port chosen before its listener starts (MASTER_PORT, a Slurm daemon's) is taken below the
    ephemeral range: an ephemeral one can be handed to another process's connection meanwhile
    (seen: EADDRINUSE beside the suite's other lane). Free when chosen; an ephemeral one where the
    range leaves no room below it."""
    import socket

    from hvdtrain.cluster import env as cluster

    low, _ = cluster.ephemeral_ports()
    ports = {cluster.free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 1, ports
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))  # still free
    narrow = tmp_path / "range"
    narrow.write_text("1024\t60999\n")
    assert cluster.ephemeral_ports(str(narrow)) == (1024, 60999)
    assert cluster.ephemeral_ports(str(tmp_path / "none")) == (32768, 60999)
