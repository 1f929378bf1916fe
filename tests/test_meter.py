"""The step meter shared by every trainer (fast tier). Its collectives come from a two-rank
stand-in whose "other rank" contributes known numbers: this checks the meter's arithmetic and
timing of reductions, not MPI (the distributed tier runs it on real ranks)."""
import numpy as np

from hvdtrain.collectives import Collectives
from hvdtrain.meter import StepMeter, Votes, stop_reason


class TwoRanks:
    """allreduce_sum adds what the other rank would send: the same stats, and its stop vote."""
    name, rank, world_size, local_rank = "stand-in", 0, 2, 0

    def __init__(self):
        self.reductions, self.barriers, self.other_signal, self.other_checkpoint_vote = [], 0, None, 0.0

    def allreduce_sum(self, values, name):
        self.reductions.append(name)
        # stats [+ the other rank's votes: its stop signal, the timed-checkpoint vote]
        votes = Votes.mine(self.other_signal, self.other_checkpoint_vote > 0).to_array()
        other = np.array([*values[:3], *votes])[:len(values)]
        return np.asarray(values, dtype=np.float64) + other

    def broadcast_object(self, obj, name):
        return obj

    def allgather_object(self, obj, name):
        return [obj, obj]

    def barrier(self):
        self.barriers += 1

    def describe(self):
        return {}

    def shutdown(self):
        pass


class Quiet:
    def progress(self, total, desc):
        class Bar:
            def update(self, n): pass
            def set_postfix(self, **kw): pass
            def close(self): pass
        return Bar()

    def __init__(self):
        self.scalar_steps = []

    def scalars(self, step, values):
        self.scalar_steps.append((step, sorted(values)))


def meter(backend, reporter, signal=None, log_interval=3, warmup_steps=1):
    return StepMeter(backend, reporter, lambda: signal, lambda: 0.1, log_interval, warmup_steps, samples_per_step=4)


def test_backends_satisfy_the_protocol():
    assert isinstance(TwoRanks(), Collectives)


def test_reduces_at_log_intervals_and_the_epochs_last_step_as_sums():
    b, r = TwoRanks(), Quiet()
    m = meter(b, r)
    m.start_epoch(steps=5, first_step=0, label="epoch 1/1")
    for step in range(1, 6):
        m.before_step()
        assert not m.after_step(step, [2.0 * step, 1.0, 4.0])   # loss sum, correct, count
    # The first step's loss once (the divergence stop's yardstick), then at step 3 and the last, 5.
    assert b.reductions == ["first_loss", "train_window", "train_window"]
    assert m.first_loss == 2.0 / 4.0
    assert [s for s, _ in m.loss_log] == [3, 5]
    # Interval 1-3: loss sums 2+4+6 over 12 samples on each rank -> 1.0; steps 4-5: 18 / 8.
    assert m.loss_log == [[3, 1.0], [5, 2.25]]
    metrics, stopped = m.end_epoch()
    assert stopped is None
    assert metrics == {"train_loss": 30 * 2 / 40, "train_acc": 10 / 40}
    assert r.scalar_steps == [(3, ["train/loss", "train/lr"]), (5, ["train/loss", "train/lr"])]


def test_warm_up_steps_are_not_timed_and_the_clock_is_between_barriers():
    b = TwoRanks()
    m = meter(b, Quiet(), warmup_steps=2)
    m.start_epoch(steps=4, first_step=0, label="e")
    for step in range(1, 5):
        m.before_step()
        m.after_step(step, [1.0, 1.0, 4.0])
    m.end_epoch()
    assert b.barriers == 2                      # start of step 3, end of epoch
    assert m.timed_samples == 2 * 4 and m.timed_seconds > 0 and m.images_per_sec > 0


def test_a_signal_on_another_rank_stops_every_rank_at_the_same_step():
    b = TwoRanks()
    b.other_signal = "SIGUSR1"
    m = meter(b, Quiet(), log_interval=2)
    m.start_epoch(steps=6, first_step=0, label="e")
    stops = []
    for step in range(1, 7):
        m.before_step()
        if m.after_step(step, [1.0, 0.0, 1.0]):
            stops.append(step)
            break
    assert stops == [2] and m.end_epoch()[1] == "SIGUSR1"


def test_a_timed_checkpoint_voted_by_the_other_rank_is_due_here_at_the_same_step():
    """--checkpoint-every 30m: rank 0's clock decides (the other rank here); this rank, whose own
    vote is no, learns it at the same log-interval step, and only there."""
    b = TwoRanks()
    m = meter(b, Quiet(), log_interval=2)
    m.start_epoch(steps=6, first_step=0, label="e")
    due = []
    for step in range(1, 7):
        b.other_checkpoint_vote = 1.0 if step >= 3 else 0.0
        m.before_step()
        m.after_step(step, [1.0, 0.0, 1.0])
        due.append(m.checkpoint_due)
        m.checkpoint_due = False  # the trainer takes it
    assert due == [False, False, False, True, False, True]


def test_sigterm_outweighs_sigusr1():
    assert stop_reason(usr1_votes=2, term_votes=1) == "SIGTERM"
    assert stop_reason(usr1_votes=1, term_votes=0) == "SIGUSR1"
    assert stop_reason(0, 0) is None


def test_votes_travel_by_name():
    """Every rank's votes, summed as one array and read back by name, whatever their order."""
    a = Votes.mine("SIGUSR1", checkpoint_due=True, writer_state=(True, False))
    b = Votes.mine("SIGTERM")
    summed = Votes.from_array(np.add(a.to_array(), b.to_array()))
    assert summed == Votes(usr1=1, term=1, checkpoint_due=1, writing=1, write_failed=0)
    assert summed.stopped_by == "SIGTERM" and Votes.mine(None).stopped_by is None


def test_device_stats_are_added_up_where_they_are_and_copied_to_the_host_only_when_reduced():
    """A torch loop keeps each step's stats on its GPU; copying them each step would make every
    step wait for the GPU. The meter adds them as they come and calls to_host at reductions only."""
    import torch

    copies = []

    def to_host(stats):
        copies.append(stats.clone())
        return stats.cpu().numpy()

    b = TwoRanks()
    m = StepMeter(b, Quiet(), lambda: None, lambda: 0.1, 3, 1, samples_per_step=4, to_host=to_host)
    m.start_epoch(steps=5, first_step=0, label="e")
    for step in range(1, 6):
        m.before_step()
        m.after_step(step, torch.tensor([2.0 * step, 1.0, 4.0], dtype=torch.float64))
    # Step 1 (the first loss), then the sums of steps 1-3 and of steps 4-5: three copies in five steps.
    assert [c.tolist() for c in copies] == [[2.0, 1.0, 4.0], [12.0, 3.0, 12.0], [18.0, 2.0, 8.0]]
    assert m.loss_log == [[3, 1.0], [5, 2.25]]
