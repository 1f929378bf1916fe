"""Log lines reach the launcher whole (fast tier)."""
import io

from hvdtrain.report import Rank0Reporter, say


class Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, s):
        self.calls.append(s)
        return super().write(s)


def test_a_line_and_its_newline_go_out_in_one_write():
    # mpirun --tag-output tags each piece it reads: a newline written apart from its line ends up
    # after a stray "[1,0]<stdout>:" (what broke the doctor's report in CI).
    stream = Writes()
    say("MPI: Open MPI v4.1.4", stream)
    assert stream.calls == ["MPI: Open MPI v4.1.4\n"]


def test_rank0_reporter_writes_whole_lines(capsys, monkeypatch):
    stream = Writes()
    monkeypatch.setattr("sys.stdout", stream)
    Rank0Reporter(is_rank0=True).info("epoch 1")
    Rank0Reporter(is_rank0=False).info("not from rank 1")
    assert len(stream.calls) == 1 and stream.calls[0].endswith("hvdtrain: epoch 1\n")
