"""Checkpoint naming, atomic writes, pruning and compatibility (fast tier: no ranks)."""
import os
import socket

import pytest

from hvdtrain import checkpoint as ckpt
from hvdtrain.errors import UsageError


def test_names_sort_by_global_step_not_by_text(tmp_path):
    names = [ckpt.checkpoint_name(step, epoch, "pt") for step, epoch in ((9, 0), (100, 3), (10, 1))]
    assert names[0] == "ckpt-e0000-s00000009.pt"
    for n in names + ["notes.txt", "ckpt-latest.pt", ".tmp-abc"]:
        (tmp_path / n).write_bytes(b"x")
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(str(tmp_path))] == [
        "ckpt-e0000-s00000009.pt", "ckpt-e0001-s00000010.pt", "ckpt-e0003-s00000100.pt"]
    assert ckpt.latest_checkpoint(str(tmp_path)).endswith("s00000100.pt")
    assert ckpt.latest_checkpoint(str(tmp_path / "absent")) is None


def test_atomic_write_leaves_the_old_file_and_no_temporary_on_failure(tmp_path):
    path = tmp_path / "ckpt-e0001-s00000010.pt"
    ckpt.atomic_write(str(path), lambda f: f.write(b"good"))
    assert path.read_bytes() == b"good"

    def crash(f):
        f.write(b"half")
        raise RuntimeError("disk gone")
    with pytest.raises(RuntimeError):
        ckpt.atomic_write(str(path), crash)
    assert path.read_bytes() == b"good"
    assert sorted(os.listdir(tmp_path)) == ["ckpt-e0001-s00000010.pt"]


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        (tmp_path / ckpt.checkpoint_name(step, 0, "npz")).write_bytes(b"x")
    ckpt.prune(str(tmp_path), 2)
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(str(tmp_path))] == [
        "ckpt-e0000-s00000003.npz", "ckpt-e0000-s00000004.npz"]
    ckpt.prune(str(tmp_path), 0)  # 0: keep everything
    assert len(ckpt.list_checkpoints(str(tmp_path))) == 2


def test_compatibility_lists_every_difference():
    saved = {"format_version": ckpt.FORMAT_VERSION, "framework": "torch", "model": "mnist_cnn", "dataset": "digits",
             "image_size": 8, "optimizer": "sgd", "num_classes": 10, "batch_size": 32}
    assert ckpt.incompatibilities(saved, {**saved, "batch_size": 64}) == []   # not a shape or meaning change
    diffs = ckpt.incompatibilities(saved, {**saved, "model": "resnet18", "optimizer": "adam"})
    assert diffs == ["model: checkpoint 'mnist_cnn', this run 'resnet18'",
                     "optimizer: checkpoint 'sgd', this run 'adam'"]
    with pytest.raises(UsageError, match="checkpoint /x/c.pt does not match this run: format_version"):
        ckpt.check_compatible("/x/c.pt", {**saved, "format_version": 0}, saved)


def test_on_torch_before_2_6_only_signed_checkpoints_load(tmp_path, monkeypatch):
    """CVE-2025-32434: torch < 2.6 can run code from a crafted file even with weights_only=True.
    A checkpoint hvdtrain wrote (and signed with this user's key) loads on any torch; one it did
    not write, or one changed since, is refused there unless --trust-checkpoints."""
    monkeypatch.setenv("HVDTRAIN_CHECKPOINT_KEY", str(tmp_path / "keys" / "checkpoint.key"))
    mine = tmp_path / "ckpt-e0001-s00000010.pt"
    ckpt.atomic_write(str(mine), lambda f: f.write(b"weights"), signed=True)  # signed before it has its name
    assert oct((tmp_path / "keys" / "checkpoint.key").stat().st_mode & 0o777) == "0o600"
    planted = tmp_path / "ckpt-e0009-s00000090.pt"
    planted.write_bytes(b"a crafted pickle")
    for version in ("2.3.1+cu121", "2.5.1", "2.14.1"):
        assert ckpt.trust_problem(str(mine), version, trusted=False) is None
    assert ckpt.trust_problem(str(planted), "2.6.0", trusted=False) is None     # safe torch: its own check
    assert ckpt.trust_problem(str(planted), "2.5.1", trusted=True) is None      # the user said so
    problem = ckpt.trust_problem(str(planted), "2.5.1", trusted=False)
    assert problem.startswith(f"checkpoint {planted} carries no signature") and "CVE-2025-32434" in problem
    assert "--trust-checkpoints" in problem
    # Signed, then truncated or altered: damaged, like a file that fails to read (ValueError), so
    # resume moves it aside for the one before it instead of refusing for good.
    mine.write_bytes(b"weig")
    with pytest.raises(ValueError, match="no longer match its signature"):
        ckpt.trust_problem(str(mine), "2.3.1", trusted=False)
    assert ckpt.trust_problem(str(mine), "2.3.1", trusted=True) is None
    # Pruning and moving aside take the signature along.
    ckpt.sign(str(mine))
    aside = ckpt.move_aside(str(mine))
    assert os.path.exists(aside + ".sig") and not os.path.exists(str(mine) + ".sig")
    assert not ckpt.torch_is_safe("2.5.1") and ckpt.torch_is_safe("2.6.0") and ckpt.torch_is_safe("10.0")


def test_the_per_rank_checksum_covers_batchnorm_statistics():
    """Ranks whose running statistics differ must not look alike in the result file."""
    from types import SimpleNamespace

    import torch

    from hvdtrain.result_file import checksum_arrays
    from hvdtrain.torch.train import Trainer

    one, two = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    two.running_mean += 1.0  # same weights, other statistics
    checksums = [checksum_arrays(Trainer._state_arrays(SimpleNamespace(raw_model=m))) for m in (one, two)]
    assert checksums[0] != checksums[1]


def test_a_resized_run_keeps_its_own_checkpoints_newest(tmp_path):
    """A resize: one rank, 43 steps an epoch, checkpoints at the ends of epochs 1-3 (names of the
    earlier format, without the samples field: no -n), then --allow-resize to 2 ranks (21 steps an
    epoch): its global steps are smaller (84, 105, 126 < 129), so retention by global step would
    delete them first and the next start would resume from epoch 3 again. Epochs first, then
    samples, then steps."""
    old = ["ckpt-e0001-s00000043.pt", "ckpt-e0002-s00000086.pt", "ckpt-e0003-s00000129.pt"]
    # Before the resize, one rank was 30 steps into epoch 4 (an older name, without samples); the
    # resized run resumed from it (960 samples: step 15 of 21) and wrote at 17 and 20 steps of
    # 2 x 32 samples, then at the ends of epochs 4 and 5.
    new = [ckpt.checkpoint_name(80, 3, "pt", samples_in_epoch=17 * 64), ckpt.checkpoint_name(84, 4, "pt"),
           ckpt.checkpoint_name(105, 5, "pt", samples_in_epoch=0)]
    assert new == ["ckpt-e0003-s00000080-n000000001088.pt", "ckpt-e0004-s00000084.pt", "ckpt-e0005-s00000105.pt"]
    mid_old, mid_new = "ckpt-e0003-s00000159.pt", ckpt.checkpoint_name(83, 3, "pt", samples_in_epoch=20 * 64)
    for name in old + new + [mid_old, mid_new]:
        (tmp_path / name).write_bytes(b"x")
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(str(tmp_path))] == [
        old[0], old[1], old[2], mid_old, new[0], mid_new, new[1], new[2]]
    ckpt.prune(str(tmp_path), keep=3)
    assert sorted(os.listdir(tmp_path)) == sorted([mid_new, new[1], new[2]])
    assert ckpt.latest_checkpoint(str(tmp_path)).endswith(new[2])
    assert ckpt.order_key("ckpt-e0003-s00000129.npz") == (3, 0, 129) and ckpt.order_key("ckpt-latest.pt") is None


class _OneRank:
    """One rank's collectives: what rank 0 broadcasts is what it has (the policy is rank 0's)."""
    @staticmethod
    def broadcast_object(value, name):
        return value


def test_the_resume_policy_moves_damaged_checkpoints_aside_and_stops_at_a_misfit(tmp_path):
    """The one resume policy of every entry point: the newest checkpoint that loads wins, the
    damaged ones newer than it are moved aside with a line each; one that reads but does not fit
    ends the walk; none that loads is an error naming the newest, not a silent fresh start."""
    names = [ckpt.checkpoint_name(step, 0, "pt") for step in (1, 2, 3)]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    (tmp_path / f"{ckpt.TMP_PREFIX}{socket.gethostname()}-999999999-x").write_bytes(b"half")  # a crash's
    contents = {names[0]: "good", names[1]: "damaged", names[2]: "damaged"}
    said = []

    def load(path):
        if contents[os.path.basename(path)] == "damaged":
            raise EOFError("truncated")
        if contents[os.path.basename(path)] == "misfit":
            raise UsageError(f"checkpoint {path} does not fit")
        return {"path": path, "position": 1}

    status = ckpt.resume_on_rank0(_OneRank, True, str(tmp_path), load, said.append, "t")
    assert status == {"path": str(tmp_path / names[0]), "position": 1}
    assert sorted(os.listdir(tmp_path)) == [names[0], names[1] + ".damaged", names[2] + ".damaged"]
    assert f"checkpoint {tmp_path / names[2]} is unreadable or corrupt (EOFError: truncated): moved to " \
           f"{tmp_path / names[2]}.damaged; resuming from {tmp_path / names[0]}" in said
    assert any("left by an interrupted checkpoint write" in line for line in said)

    contents[names[0]] = "misfit"
    (tmp_path / names[1]).write_bytes(b"x")
    contents[names[1]] = "damaged"
    with pytest.raises(UsageError, match="does not fit"):  # the misfit ends the walk, nothing moved
        ckpt.resume_on_rank0(_OneRank, True, str(tmp_path), load, said.append, "t")
    assert (tmp_path / names[1]).exists()
    contents[names[0]] = "damaged"
    with pytest.raises(UsageError, match=rf"checkpoint {tmp_path / names[1]} is unreadable or corrupt "
                                         r"\(EOFError: truncated\); so are the 1 older ones"):
        ckpt.resume_on_rank0(_OneRank, True, str(tmp_path), load, said.append, "t")
    assert ckpt.resume_on_rank0(_OneRank, True, str(tmp_path / "empty"), load, said.append, "t") == {}
