"""One declaration per option (hvdtrain/options.py, hvdtrain/config.py): every TrainConfig field
carries its help, per-rank and resume rules, and the command line, the ranks' agreement, the
refusals and the resume keys are derived from it (fast tier)."""
import dataclasses

import pytest

from hvdtrain import backends, options
from hvdtrain import checkpoint as ckpt
from hvdtrain.config import OPTION_GROUPS, TrainConfig, build_parser
from hvdtrain.errors import UsageError
from hvdtrain.options import MATCH, Option, declared, opt

FIELDS = dataclasses.fields(TrainConfig)


def test_every_field_declares_its_option():
    for field in FIELDS:
        o = field.metadata.get("option")
        assert isinstance(o, Option), f"TrainConfig.{field.name} has no opt(...) declaration"
        assert o.help and isinstance(o.per_rank, bool) and o.resume in (options.MATCH, options.RESIZE, options.FREE)


def test_a_field_without_its_declaration_cannot_be_added():
    bare = dataclasses.make_dataclass("WithANewOption", [("new_option", int, dataclasses.field(default=1))],
                                      bases=(TrainConfig,), frozen=True)
    with pytest.raises(TypeError, match="fields without an option declaration: new_option"):
        declared(bare)
    with pytest.raises(TypeError, match="per_rank"):
        opt(1, help="a new option", resume=MATCH)  # per_rank is required
    with pytest.raises(TypeError, match="resume"):
        opt(1, help="a new option", per_rank=False, resume="maybe")
    with pytest.raises(TypeError, match="backends"):
        opt(False, help="a new option", per_rank=False, resume=MATCH, backends=("ddp",))  # horovod honours all


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_command_line_is_the_declared_flags(framework):
    parser = build_parser(framework, ["resnet50", "mnist_cnn"], "prog")
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    declared_flags = [f for f in FIELDS if options.option(f).flag and framework in options.option(f).frameworks]
    assert set(actions) == {f.name for f in declared_flags}  # (shown in groups, OPTION_GROUPS)
    grouped = [name for names in OPTION_GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped)) and set(actions) <= set(grouped)  # each in one group
    for field in declared_flags:
        o, action = options.option(field), actions[field.name]
        renamed = {"warmup_steps": ["--untimed-steps", "--warmup-steps"]}  # the old spelling still works
        assert action.option_strings == renamed.get(field.name, ["--" + field.name.replace("_", "-")])
        assert action.help and "default" in parser.formatter_class("p")._get_help_string(action), field.name
        expected = o.choices(framework) if callable(o.choices) else o.choices
        assert (list(action.choices) if action.choices else None) == (list(expected) if expected else None)
        recipe_option = field.name in ("base_lr", "warmup_epochs", "lr_schedule", "optimizer", "momentum",
                                       "weight_decay")
        assert action.default == (None if recipe_option else field.default), field.name
    assert "amp" in actions if framework == "torch" else "loop" in actions
    assert not {"framework", "recipe", "recipe_overrides", "world_size"} & set(actions)


def test_what_ranks_may_differ_in_and_what_a_resume_must_match():
    per_rank = {f.name for f in FIELDS if options.option(f).per_rank}
    assert per_rank == {"threads_per_rank", "num_workers", "data_dir", "checkpoint_dir", "log_dir", "result_json",
                        "recipe_overrides", "world_size"}
    cfg = TrainConfig(data_dir="/mine", threads_per_rank=3)
    assert set(options.shared(cfg)) == {f.name for f in FIELDS} - per_rank
    assert ckpt.compatible_keys("torch") == ("framework", "model", "dataset", "loss", "image_size", "optimizer",
                                             "num_classes")
    assert ckpt.compatible_keys("tf") == ("framework", "model", "dataset", "loss", "image_size", "optimizer", "loop",
                                          "num_classes")
    assert ckpt.RESIZE_KEYS == ("world_size", "batch_size", "batches_per_allreduce")


@pytest.mark.parametrize("backend", backends.BACKENDS, ids=lambda b: b.label)
def test_options_declared_for_some_backends_are_refused_by_the_others(backend):
    """Every option declared for some backends is accepted by those and refused, naming the option
    and the backend, by every other backend of the framework."""
    for field in FIELDS:
        honoured_by = options.option(field).backends
        if honoured_by is None:
            continue
        given = {"cycle_time_ms": 2.0}.get(field.name, True)
        base = {"loop": "custom"} if backend.framework == "tf" else {}
        options_given = dict(framework=backend.framework, backend=backend.name, **base, **{field.name: given})
        if backend.name in honoured_by:
            TrainConfig(**options_given)
        else:
            with pytest.raises(UsageError, match=f"^--{field.name.replace('_', '-')} .*--backend {backend.name}"):
                TrainConfig(**options_given)


@pytest.mark.parametrize("given, line", [
    (dict(backend="accelerate", loader="dali"),
     "--loader is honoured by --backend horovod and ddp only, not by --backend accelerate (use one of those)"),
    (dict(backend="accelerate", fp16_allreduce=True),
     "--fp16-allreduce is honoured by --backend horovod and ddp and lightning only, not by --backend accelerate "
     "(use one of those)"),
    (dict(backend="ddp", use_adasum=True),
     "--use-adasum is a Horovod option, which --backend ddp does not have (use --backend horovod)"),
    (dict(framework="tf", loop="custom", backend="mwms", fp16_allreduce=True),
     "--fp16-allreduce is a Horovod option, which --backend mwms does not have (use --backend horovod)"),
])
def test_an_unhonoured_option_names_the_backends_that_honour_it(given, line):
    """The line names the backends of this framework that honour the option (TF's horovod alone
    for --fp16-allreduce, which three torch backends honour), or says it is Horovod's own."""
    with pytest.raises(UsageError) as refused:
        TrainConfig(**given)
    assert str(refused.value) == line


def test_bounds_are_checked_as_declared():
    with pytest.raises(UsageError, match=r"--image-size must be >= 8 \(got 4\)"):
        TrainConfig(image_size=4)
    with pytest.raises(UsageError, match=r"--cycle-time-ms must be a finite number > 0 \(got 0\)"):
        TrainConfig(cycle_time_ms=0.0)
    TrainConfig(steps=None, threads_per_rank=None, warmup_epochs=0.0, num_workers=0)  # None and the bound pass


def test_the_tf_trainers_log_leaves_out_torch_only_options():
    """The start-up's config line shows the trainer's own options: TF's has no --amp or --feeder
    (--loader is both frameworks': dali for TensorFlow too)."""
    torch_only = {"amp", "channels_last", "num_workers", "feeder"}
    assert torch_only <= options.not_of(TrainConfig, "tf")
    assert not torch_only & options.not_of(TrainConfig, "torch")
    assert "loop" in options.not_of(TrainConfig, "torch") and "loop" not in options.not_of(TrainConfig, "tf")
    assert not {"loader"} & (options.not_of(TrainConfig, "tf") | options.not_of(TrainConfig, "torch"))
