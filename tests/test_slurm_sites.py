"""The templates, the generator's output and the sbatch scripts of README.md and docs/ against
nodes shaped like the sites' (Jean Zay gpu_p13 and gpu_p2, JUWELS booster), with `sbatch
--test-only` on a second slurmctld, and the CPU templates against the local cluster."""
import os
import re
import time

import pytest

from conftest import base_env
from slurm_helpers import TEMPLATES, generator, run, stop_daemons, tail, write_cluster_config
from test_slurm_generator import sbatch_blocks

SITE_NODES = """\
NodeName=jz[1-4] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=20 ThreadsPerCore=2 RealMemory=160000 Gres=gpu:4 State=CLOUD
NodeName=jzp2-[1-2] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=12 ThreadsPerCore=2 RealMemory=360000 Gres=gpu:8 State=CLOUD
NodeName=jwb[1-2] NodeAddr=127.0.0.1 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2 RealMemory=500000 Gres=gpu:4 State=CLOUD
PartitionName=gpu_p13 Nodes=jz[1-4] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu_p2 Nodes=jzp2-[1-2] MaxTime=INFINITE State=UP
PartitionName=booster Nodes=jwb[1-2] MaxTime=INFINITE State=UP"""
# CLOUD nodes that are never powered up (no slurmd): the scheduler still answers --test-only.
SITE_EXTRA = "GresTypes=gpu\nSuspendProgram=/bin/true\nResumeProgram=/bin/true\nSuspendTime=600"


@pytest.fixture(scope="module")
def site_shaped_controller(slurm_cluster, tmp_path_factory):
    """A second slurmctld, for `sbatch --test-only` only, whose nodes have the sites' shapes:
    Jean Zay gpu_p13 (default; 4 GPUs, 2x20 cores x 2 threads), gpu_p2 (8 GPUs, 2x12 cores x 2
    threads), JUWELS booster (4 GPUs, 2x24 cores x 2 threads) and reservation RESERVATION.

    Its nodes are CLOUD nodes that are never powered up: no slurmd, nothing runs. The scheduler
    still answers --test-only against their declared CPUs, sockets, threads and GRES, so a
    template asking for more than such a node has (cpus x tasks, GPUs, nodes) is refused, as on
    the real site. Not checked: the sites' real QoS, accounts, limits and software."""
    d = tmp_path_factory.mktemp("site-shaped")
    conf = write_cluster_config(str(d), "sitesshaped", SITE_NODES, munge_socket=f"{slurm_cluster}/munge/munge.socket",
                                extra=SITE_EXTRA)
    env = base_env()
    env["SLURM_CONF"] = conf
    run(["slurmctld", "-f", conf], env=env, timeout=60)
    try:
        deadline = time.monotonic() + 60
        while run(["sinfo", "-h"], env=env, check=False, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                pytest.fail(f"site-shaped slurmctld did not answer:\n{tail(str(d / 'log' / 'slurmctld.log'))}")
            time.sleep(1)
        run(["scontrol", "create", "reservation", "ReservationName=RESERVATION", "Users=root",
             "Nodes=jwb[1-2]", "StartTime=now", "Duration=UNLIMITED"], env=env)
        yield env
    finally:
        stop_daemons([str(d / "run" / "slurmctld.pid")])


def _test_only(script_path: str, env: dict) -> str:
    done = run(["sbatch", "--test-only", script_path], env=env, check=False, timeout=60)
    assert done.returncode == 0 and "to start at" in done.stderr, \
        f"sbatch --test-only {script_path}:\n{done.stdout}\n{done.stderr}"
    return done.stderr


@pytest.mark.parametrize("path", TEMPLATES, ids=os.path.basename)
def test_template_passes_test_only_on_site_shaped_nodes(site_shaped_controller, path):
    said = _test_only(path, site_shaped_controller)
    with open(path) as f:
        wanted = re.search(r"--partition=(\S+)", f.read())
    assert f"in partition {wanted.group(1) if wanted else 'gpu_p13'}" in said, said


@pytest.mark.parametrize("argv", [
    ["--preset", "jean-zay", "--nodes", "4", "--qos", "qos_gpu-t3"],
    ["--preset", "jean-zay", "--gpus-per-node", "2", "--framework", "tf"],
    ["--preset", "jean-zay-gpu_p2", "--nodes", "2", "--time", "1-00:00:00"],
    ["--preset", "juwels-booster", "--account", "proj", "--reservation", "RESERVATION", "--time", "30"],
    ["--cpu-only", "--nodes", "2", "--tasks-per-node", "4", "--cpus-per-task", "10", "--hint", "nomultithread"],
], ids=lambda a: " ".join(a))
def test_generator_output_passes_test_only_on_site_shaped_nodes(site_shaped_controller, tmp_path, argv):
    script = tmp_path / "job.sbatch"
    assert generator(*argv, "-o", str(script)).returncode == 0
    _test_only(str(script), site_shaped_controller)


def test_site_shaped_nodes_refuse_what_the_sites_would(site_shaped_controller, tmp_path):
    """The check has teeth: 5 Jean Zay nodes (it has 4 here), and 4 x 20 physical cores
    (--cores-per-node lies to get past the generator's own check)."""
    for argv in (["--preset", "jean-zay", "--nodes", "5"],
                 ["--preset", "jean-zay", "--cpus-per-task", "20", "--cores-per-node", "80"]):
        script = tmp_path / "job.sbatch"
        assert generator(*argv, "-o", str(script)).returncode == 0
        done = run(["sbatch", "--test-only", str(script)], env=site_shaped_controller, check=False)
        assert done.returncode != 0 and "not available" in done.stderr, done.stderr


@pytest.mark.parametrize("path", [t for t in TEMPLATES if "cpu" in os.path.basename(t)], ids=os.path.basename)
def test_cpu_template_passes_test_only_on_the_local_cluster(slurm_cluster, path):
    _test_only(path, base_env())


@pytest.mark.parametrize("where, script", sbatch_blocks(), ids=[w for w, _ in sbatch_blocks()])
def test_docs_sbatch_script_passes_test_only_on_site_shaped_nodes(site_shaped_controller, tmp_path, where, script):
    """The sbatch scripts of README.md and docs/*.md, as a user would copy them: Slurm parses
    every directive and the request fits the site's nodes (their convention is checked in
    tests/test_slurm_generator.py)."""
    path = tmp_path / "job.sbatch"
    path.write_text(script + "\n")
    _test_only(str(path), site_shaped_controller)
