"""Three Slurm nodes on one machine (n1 is this host; n2 and n3 are slurmd in their own network,
UTS and mount namespaces): the CPU template's job on 2 nodes x 1 task trains like 1 node x 2
tasks, and a scaling study over 1, 2 and 3 nodes runs, collects and reports its jobs."""
import json
import os
import subprocess
import time

import pytest

from conftest import PYTHON, REPO, base_env
from hvdtrain import slurm as gen
from slurm_helpers import CPU_TEMPLATE, generator, result_of, run, stop_daemons, tail, wait_for_end, write_cluster_config

NAMESPACE_NODES = (2, 3)  # n1 is this host


def _nodes_config(subnet: str) -> str:
    names = ["n1", *(f"n{k}" for k in NAMESPACE_NODES)]
    lines = [f"NodeName={name} NodeAddr={subnet}.{k} CPUs=1 RealMemory=2000 State=UNKNOWN"
             for k, name in enumerate(names, start=1)]
    return "\n".join(lines + [f"PartitionName=nodes Nodes=n[1-{len(names)}] Default=YES MaxTime=INFINITE State=UP "
                               "OverSubscribe=YES"])


@pytest.fixture(scope="module")
def three_node_cluster(slurm_cluster, tmp_path_factory):
    """A second Slurm cluster with three nodes on this machine: n1 is this host; n2 and n3 are
    slurmd in their own network namespace (own IP on a veth pair whose host end is on one
    bridge, so the nodes reach each other), hostname (UTS namespace) and TmpFS (mount namespace:
    Slurm's PMIx plugin makes same-named directories there for each step, which nodes may not
    share). All use the session cluster's munged. Needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN
    (as in CI); otherwise the tests are skipped, saying why."""
    tag = f"hvd{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250 + 1}"
    d = tmp_path_factory.mktemp("nodes")
    bridge = f"{tag}b"
    setup = [["ip", "link", "add", bridge, "type", "bridge"],
             ["ip", "addr", "add", f"{subnet}.1/24", "dev", bridge],
             ["ip", "link", "set", bridge, "up"]]
    for k in NAMESPACE_NODES:
        ns, host_if, ns_if = f"{tag}n{k}", f"{tag}h{k}", f"{tag}c{k}"
        (d / f"tmpfs-n{k}").mkdir()
        setup += [["ip", "netns", "add", ns],
                  ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                  ["ip", "link", "set", ns_if, "netns", ns],
                  ["ip", "link", "set", host_if, "master", bridge],
                  ["ip", "link", "set", host_if, "up"],
                  ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.{k}/24", "dev", ns_if],
                  ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
                  ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    conf = d / "slurm.conf"
    env = base_env()
    env["SLURM_CONF"] = str(conf)
    env.pop("SLURM_PMIX_TMPDIR", None)   # one path for all nodes would collide; their TmpFS differ
    try:
        for cmd in setup:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except OSError as err:  # no `ip` here
                pytest.skip(f"no namespace nodes: `{' '.join(cmd)}` could not run: {err}")
            if done.returncode != 0:
                pytest.skip(f"no namespace nodes: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
        write_cluster_config(str(d), "nodes", _nodes_config(subnet), ctld_addr=f"{subnet}.1",
                             munge_socket=f"{slurm_cluster}/munge/munge.socket")
        run(["slurmctld", "-f", str(conf)], env=env)
        run(["slurmd", "-f", str(conf), "-N", "n1"], env=env)
        for k in NAMESPACE_NODES:
            node = (f"hostname n{k} && mount --bind {d}/tmpfs-n{k} {d}/tmp && mount -t tmpfs tmpfs /dev/shm && "
                    f"exec nsenter --net=/var/run/netns/{tag}n{k} slurmd -f {conf} -N n{k}")
            run(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", node], env=env)
        deadline = time.monotonic() + 90
        while run(["sinfo", "-h", "-N", "-o", "%T"], env=env, check=False).stdout.split() != ["idle"] * 3:
            if time.monotonic() > deadline:
                pytest.fail(f"three-node cluster not idle after 90 s: {run(['sinfo', '-N'], env=env, check=False)}\n"
                            f"{tail(str(d / 'log' / 'slurmctld.log'))}")
            time.sleep(0.25)
        yield {"env": env, "dir": str(d)}
    finally:
        stop_daemons([str(d / "run" / f"{name}.pid")
                      for name in (*(f"slurmd-n{k}" for k in NAMESPACE_NODES), "slurmd-n1", "slurmctld")])
        for k in NAMESPACE_NODES:
            subprocess.run(["ip", "link", "del", f"{tag}h{k}"], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", f"{tag}n{k}"], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def test_two_nodes_one_task_each_train_like_one_node_two_tasks(three_node_cluster, uninterrupted, tmp_path):
    """The CPU template's training as 2 nodes x 1 task: it completes, the ranks run on different
    nodes, and the weights equal those of 1 node x 2 tasks (same ranks, same data, same seed)."""
    env = three_node_cluster["env"]
    with open(CPU_TEMPLATE) as f:
        argv = gen.credited_argv(f.read())
    trainer = argv[argv.index("--") + 1:]
    script = tmp_path / "two.sbatch"
    assert generator("--cpu-only", "--nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1",
                     "--time", "10", "--signal-lead", "120", "-o", str(script), "--", *trainer).returncode == 0
    job_id = run(["sbatch", "--parsable", str(script)], env=env, cwd=str(tmp_path)).stdout.strip()
    log = str(tmp_path / f"hvdtrain-torch-{job_id}.out")
    info = wait_for_end(job_id, log, timeout=300, env=env)
    assert info["JobState"] == "COMPLETED" and info["NumNodes"] == "2", (info, tail(log))
    result = result_of(str(tmp_path), job_id)
    reference = result_of(uninterrupted["cwd"], uninterrupted["job_id"])
    assert result["world_size"] == 2 and len({r["host"] for r in result["ranks"]}) == 2, result["ranks"]
    assert [r["param_checksum"] for r in result["ranks"]] == [r["param_checksum"] for r in reference["ranks"]]


STUDY_TRAINER = "--model mnist_cnn --dataset digits --epochs 1 --batch-size 16"
STUDY_JOBS = ["--cpu-only", "--cpus-per-task", "1", "--time", "10", "--signal-lead", "60"]


def study(env, *argv, timeout=900):
    return subprocess.run([PYTHON, "-m", "hvdtrain.compare", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)


def test_scaling_study_over_one_and_three_nodes(three_node_cluster, tmp_path):
    """`hvdtrain.compare --nodes 1,3` for two backends: --dry-run writes four scripts that sbatch
    accepts (--test-only); submitted with --wait, every job runs on its node count and the report's
    figures are the jobs' own result files; a collection again gives the same report; a job that
    fails is a failed row and makes the exit status 1. (Two nodes: the test above, under the
    generator's script; a third node count would add two jobs and nothing the study decides.)"""
    env = three_node_cluster["env"]
    common = ["--nodes", "1,3", "--backends", "horovod-torch,horovod-tf", "--train-args", STUDY_TRAINER,
              "--target-accuracy", "0.3"]
    dry = study(env, *common, "--out", str(tmp_path / "dry"), "--dry-run", "--", *STUDY_JOBS, timeout=120)
    assert dry.returncode == 0 and "4 job script(s) written, none submitted" in dry.stdout, dry.stdout + dry.stderr
    scripts = sorted((tmp_path / "dry" / "jobs").glob("*.sbatch"))
    assert [s.name for s in scripts] == sorted(f"{b}-n{n}-r0.sbatch" for b in ("horovod-torch", "horovod-tf")
                                               for n in (1, 3))
    for script in scripts:
        assert f"#SBATCH --nodes={script.name.split('-n')[1][0]}" in script.read_text()
        run(["sbatch", "--test-only", str(script)], env=env, cwd=str(script.parent))

    # A job that fails (its data directory does not exist), submitted beside the study.
    failing = study(env, "--nodes", "1", "--backends", "horovod-torch", "--train-args",
                    "--model mnist_cnn --dataset imagefolder --data-dir /nonexistent/hvdtrain-data",
                    "--out", str(tmp_path / "failing"), "--", *STUDY_JOBS, timeout=120)
    assert failing.returncode in (1, 3), failing.stdout + failing.stderr  # failed already, or not done yet

    out = tmp_path / "study"
    done = study(env, *common, "--out", str(out), "--wait", "--poll", "1", "--wait-limit", "600", "--", *STUDY_JOBS)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    report = json.loads((out / "scaling.json").read_text())
    assert (out / "scaling.png").stat().st_size > 10_000
    table = (out / "scaling.md").read_text()
    rows = {(r["backend"], r["nodes"]): r for r in report["summary"]}
    assert len(rows) == 4 and all(r["state"] == "ok" for r in rows.values()), rows
    for m in report["measurements"]:
        result = json.loads(open(m["result_json"]).read())
        row = rows[(m["backend"], m["nodes"])]
        # One rank per node, each on its own node; the row's figures are the job's own.
        assert result["world_size"] == m["nodes"] == m["np"] and len({r["host"] for r in result["ranks"]}) == m["nodes"]
        assert row["total_images_per_sec"] == result["throughput"]["total_images_per_sec"]
        assert row["images_per_sec_per_rank"] == result["throughput"]["total_images_per_sec"] / m["nodes"]
        one = rows[(m["backend"], 1)]["images_per_sec_per_rank"]
        assert row["scaling_efficiency"] == pytest.approx(row["images_per_sec_per_rank"] / one)
        reached = next((h["elapsed_s"] for h in result["history"] if h["val_acc"] >= 0.3), None)
        assert row["time_to_accuracy_s"] == reached
        assert row["epoch_seconds"] == pytest.approx(result["history"][-1]["elapsed_s"] / result["history"][-1]["epoch"])
        line = f"| {m['backend']} | {m['nodes']} | {m['np']} | ok | {result['throughput']['total_images_per_sec']:.2f} |"
        assert line in table, table
        if m["backend"] == "horovod-torch":  # the per-rank breakdown and the slowest-rank line (torch only)
            assert set(row["phases_ms"]) == {"data", "compute", "sync", "optimizer", "other"} and row["slowest_rank"]
        else:
            assert row["phases_ms"] is None
    assert "Horovod built with: " in table and "mpi_built" in table

    # The prediction checked against the study: the network measured by the doctor over the three
    # nodes (srun), the study's 1-node run as the one GPU's step, its 3-node run as the measurement.
    doctor = run(["srun", "--mpi=pmix", "-N", "3", "-n", "3", "-t", "5", PYTHON, "-m", "hvdtrain.doctor",
                  "--framework", "torch", "--json", str(tmp_path / "doctor.json")], env=env, cwd=REPO,
                 timeout=180, check=False)
    assert (tmp_path / "doctor.json").exists(), doctor.stdout[-3000:] + doctor.stderr[-3000:]
    # Within a node as fast as can be: the doctor's network figures alone can make the prediction.
    (tmp_path / "nodes.toml").write_text('name = "three namespace nodes"\ngpus_per_node = 1\ncores_per_gpu = 1\n'
                                         'intra_busbw_gbs = 1000.0\ninter_busbw_gbs = 1000.0\noverlap = false\n')
    one = next(m for m in report["measurements"] if m["backend"] == "horovod-torch" and m["nodes"] == 1)
    three = next(m for m in report["measurements"] if m["backend"] == "horovod-torch" and m["nodes"] == 3)
    predicted = subprocess.run([PYTHON, "-m", "hvdtrain.predict", "--cluster", str(tmp_path / "nodes.toml"),
                                "--doctor", str(tmp_path / "doctor.json"), "--from-result", one["result_json"],
                                "--gpus", "1", "3", "--backends", "horovod", "--check", str(out),
                                "--json", str(tmp_path / "p.json")],
                               capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    print(predicted.stdout)
    [checked] = json.loads((tmp_path / "p.json").read_text())["study_check"]
    measured = json.loads(open(three["result_json"]).read())["throughput"]["total_images_per_sec"]
    assert (checked["backend"], checked["gpus"], checked["nodes"]) == ("horovod", 3, 3)
    assert checked["measured_images_per_s"] == measured
    # The prediction is the model's on the doctor's network figures, not the profile's.
    from hvdtrain.predict import cli as predict_cli, model, node, profiles
    network = node.measured_cluster(profiles.load(str(tmp_path / "nodes.toml")),
                                    json.loads((tmp_path / "doctor.json").read_text()))
    assert network.inter_busbw_gbs < 100  # a veth bridge, not the profile's 1000
    work = predict_cli.workload_from_result(predict_cli.load_result(one["result_json"]), "", None, 0.0, 0.0)
    assert checked["predicted_images_per_s"] == pytest.approx(model.step(work, 3, network, model.HOROVOD).images_per_s)
    assert "across 3 nodes" in predicted.stdout and "the prediction against the study in" in predicted.stdout

    # The collection needs only the result files and is idempotent.
    again = study(env, "--collect", str(out), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((out / "scaling.json").read_text())["summary"] == report["summary"]

    collected = study(env, "--collect", str(tmp_path / "failing"), timeout=120)
    deadline = time.monotonic() + 120
    while collected.returncode == 3 and time.monotonic() < deadline:  # still queued or running
        time.sleep(3)
        collected = study(env, "--collect", str(tmp_path / "failing"), timeout=120)
    assert collected.returncode == 1, collected.stdout + collected.stderr
    [row] = json.loads((tmp_path / "failing" / "scaling.json").read_text())["summary"]
    assert row["state"] == "failed" and "/nonexistent/hvdtrain-data" in row["error"], row
    assert "| horovod-torch | 1 | 1 | failed |" in collected.stdout
