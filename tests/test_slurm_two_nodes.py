"""Two Slurm nodes on one machine (a second slurmd in its own network, UTS and mount namespaces)
train the CPU template's job like one node with two tasks."""
import os
import subprocess
import time

import pytest

from conftest import base_env
from hvdtrain import slurm as gen
from slurm_helpers import CPU_TEMPLATE, generator, result_of, run, stop_daemons, tail, wait_for_end, write_cluster_config


# n1 is this host, n2 a slurmd in its own network namespace at {subnet}.2.
TWO_NODES = """\
NodeName=n1 NodeAddr={subnet}.1 CPUs=1 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeAddr={subnet}.2 CPUs=1 RealMemory=2000 State=UNKNOWN
PartitionName=two Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"""


@pytest.fixture(scope="module")
def two_node_cluster(slurm_cluster, tmp_path_factory):
    """A second Slurm cluster with two nodes on this machine: n1 is this host; n2 is a slurmd in
    its own network namespace (own IP on a veth pair), hostname (UTS namespace) and TmpFS (mount
    namespace: Slurm's PMIx plugin makes same-named directories there for each step, which two
    nodes may not share). Both use the session cluster's munged. Needs root with CAP_NET_ADMIN
    and CAP_SYS_ADMIN (as in CI); otherwise the 2-node test is skipped, saying why."""
    tag = f"hvd{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250 + 1}"
    d = tmp_path_factory.mktemp("two-nodes")
    (d / "tmpfs-n2").mkdir()
    ns, host_if, ns_if = tag, f"{tag}h", f"{tag}c"
    setup = [["ip", "netns", "add", ns],
             ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
             ["ip", "link", "set", ns_if, "netns", ns],
             ["ip", "addr", "add", f"{subnet}.1/24", "dev", host_if],
             ["ip", "link", "set", host_if, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", ns_if],
             ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    conf = d / "slurm.conf"
    env = base_env()
    env["SLURM_CONF"] = str(conf)
    env.pop("SLURM_PMIX_TMPDIR", None)   # one path for n1 and n2 would collide; their TmpFS differ
    try:
        for cmd in setup:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except OSError as err:  # no `ip` here
                pytest.skip(f"no second node: `{' '.join(cmd)}` could not run: {err}")
            if done.returncode != 0:
                pytest.skip(f"no second node: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
        write_cluster_config(str(d), "twonodes", TWO_NODES.format(subnet=subnet), ctld_addr=f"{subnet}.1",
                             munge_socket=f"{slurm_cluster}/munge/munge.socket")
        run(["slurmctld", "-f", str(conf)], env=env)
        run(["slurmd", "-f", str(conf), "-N", "n1"], env=env)
        n2 = (f"hostname n2 && mount --bind {d}/tmpfs-n2 {d}/tmp && mount -t tmpfs tmpfs /dev/shm && "
              f"exec nsenter --net=/var/run/netns/{ns} slurmd -f {conf} -N n2")
        run(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", n2], env=env)
        deadline = time.monotonic() + 90
        while run(["sinfo", "-h", "-N", "-o", "%T"], env=env, check=False).stdout.split() != ["idle", "idle"]:
            if time.monotonic() > deadline:
                pytest.fail(f"two-node cluster not idle after 90 s: {run(['sinfo', '-N'], env=env, check=False)}\n"
                            f"{tail(str(d / 'log' / 'slurmctld.log'))}")
            time.sleep(1)
        yield {"env": env, "dir": str(d)}
    finally:
        stop_daemons([str(d / "run" / f"{name}.pid") for name in ("slurmd-n2", "slurmd-n1", "slurmctld")])
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_two_nodes_one_task_each_train_like_one_node_two_tasks(two_node_cluster, uninterrupted, tmp_path):
    """The CPU template's training as 2 nodes x 1 task: it completes, the ranks run on different
    nodes, and the weights equal those of 1 node x 2 tasks (same ranks, same data, same seed)."""
    env = two_node_cluster["env"]
    with open(CPU_TEMPLATE) as f:
        argv = gen.credited_argv(f.read())
    trainer = argv[argv.index("--") + 1:]
    script = tmp_path / "two.sbatch"
    assert generator("--cpu-only", "--nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1",
                     "--time", "10", "--signal-lead", "120", "-o", str(script), "--", *trainer).returncode == 0
    job_id = run(["sbatch", "--parsable", str(script)], env=env, cwd=str(tmp_path)).stdout.strip()
    log = str(tmp_path / f"hvdtrain-torch-{job_id}.out")
    info = wait_for_end(job_id, log, timeout=300, env=env)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "n[1-2]", (info, tail(log))
    result = result_of(str(tmp_path), job_id)
    reference = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["world_size"] == 2 and len({r["host"] for r in result["ranks"]}) == 2, result["ranks"]
    assert [r["param_checksum"] for r in result["ranks"]] == [r["param_checksum"] for r in reference["ranks"]]
