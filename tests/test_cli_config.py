"""`simlib train`'s configuration: every Plan / OptimConfig / budget / task field is a flag and a TOML key
(generated from the dataclasses), file < flags, one-line errors, the dry run. No process is started here."""

import dataclasses
import inspect

import pytest

from simlib import cli, cli_train, config
from simlib.train import OptimConfig, Plan, train


def _args(*argv):
    return cli.build_parser().parse_args(config.normalize_argv(["train", *argv]))


def test_every_dataclass_field_is_a_flag():
    parser_flags = {
        a
        for action in cli.build_parser()._subparsers._group_actions[0].choices["train"]._actions
        for a in action.option_strings
    }
    for section, cls in (("plan", Plan), ("optim", OptimConfig), ("budget", config.Budget)):
        for f in dataclasses.fields(cls):
            assert f"--{section}.{f.name.replace('_', '-')}" in parser_flags, (section, f.name)
    for cls in config.task_classes().values():
        for f in dataclasses.fields(cls):
            if f.init and f.name != "name":
                assert f"--task.{f.name.replace('_', '-')}" in parser_flags


def test_budget_mirrors_train_keywords():
    """Budget is train()'s keyword arguments: a keyword added to train() must be added here (or excluded)."""
    params = {n: p for n, p in inspect.signature(train).parameters.items() if p.kind == p.KEYWORD_ONLY}
    budget = {f.name: f.default for f in dataclasses.fields(config.Budget)}
    assert set(params) - set(config.NOT_FROM_CLI) == set(budget)
    for name, default in budget.items():
        assert params[name].default == default, name


def test_flags_convert_and_underscores_work():
    spec = cli_train.resolve(
        _args(
            "gpt",
            "--quick",
            "--world-size",
            "4",
            "--plan.pp",
            "2",
            "--plan.zero_stage",
            "1",
            "--optim.lr",
            "2e-3",
            "--optim.betas",
            "0.8,0.9",
            "--optim.grad-clip",
            "none",
            "--budget.tokens",
            "4096",
            "--budget.target",
            "eval_loss=5.5",
            "--no-budget.measure-memory",
            "--task.global-batch",
            "32",
        )
    )
    plan = spec.plans["dp"]
    assert (plan.dp, plan.pp, plan.zero_stage) == (2, 2, 1)  # dp fills the world around pp
    assert spec.optim.lr == 2e-3 and spec.optim.betas == (0.8, 0.9) and spec.optim.grad_clip is None
    assert spec.budget["tokens"] == 4096 and spec.budget["steps"] is None  # one budget replaces the default one
    assert spec.budget["target"] == {"eval_loss": 5.5} and spec.budget["measure_memory"] is False
    assert spec.task.global_batch == 32


def test_toml_file_then_flags_and_the_saved_config_round_trips(tmp_path):
    (tmp_path / "plan.toml").write_text(
        "[run]\nworld_size = 2\n\n[plan]\nzero_stage = 2\naccumulation = 2\n\n"
        "[optim]\nlr = 0.005\n\n[budget]\nsteps = 7\n"
    )
    spec = cli_train.resolve(
        _args(
            "gpt",
            "--quick",
            "--config",
            str(tmp_path / "plan.toml"),
            "--optim.lr",
            "0.004",
            "--out",
            str(tmp_path / "run"),
        )
    )
    plan = spec.plans["dp"]
    assert (plan.dp, plan.zero_stage, plan.accumulation) == (2, 2, 2)
    assert spec.optim.lr == 0.004 and spec.budget["steps"] == 7  # the flag wins over the file
    saved = tmp_path / "saved.toml"
    config.dump(spec.config["dp"], saved)
    again = cli_train.resolve(_args("--config", str(saved)))
    assert again.project == "gpt" and again.plans["dp"] == plan and again.optim == spec.optim
    assert again.budget == spec.budget and again.folders["dp"] == spec.folders["dp"]
    assert config.as_dict(again.task) == config.as_dict(spec.task)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["gpt", "--quick", "--plan.zero-stage", "5"], ["zero_stage", "0, 1, 2 or 3"]),
        (["gpt", "--quick", "--optim.lr", "fast"], ["--optim.lr", "'fast'"]),
        (["gpt", "--quick", "--task.days", "3"], ["--task.days", "gpt task"]),
        (["gpt", "--quick", "--world-size", "2", "--plan", "tp", "--plan.accumulation", "3"], ["global batch 16"]),
        (["vision", "--quick", "--plan", "tp"], ["no tensor_parallel()", "data parallelism"]),
        (["finance", "--quick", "--plan.pp", "2"], ["no pipeline_stages()"]),
    ],
)
def test_bad_input_is_one_line(argv, words, capsys):
    assert cli.main(["train", *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("simlib train: "), err
    for w in words:
        assert w in err, err


def test_unknown_toml_key_names_the_nearest(tmp_path, capsys):
    (tmp_path / "bad.toml").write_text("[plan]\nzero_stag = 1\n")
    assert cli.main(["train", "gpt", "--config", str(tmp_path / "bad.toml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'zero_stag' in [plan]" in err and "did you mean 'zero_stage'" in err


def test_vision_accepts_what_applies(capsys):
    assert (
        cli.main(["train", "vision", "--quick", "--plan.zero-stage", "1", "--plan.accumulation", "2", "--dry-run"]) == 0
    )
    out = capsys.readouterr().out
    assert "dp2 acc2 zero1" in out and "sync_batchnorm=True" in out


def test_dry_run_prints_plan_mesh_memory_and_prediction(capsys, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cli.main(["train", "gpt", "--quick", "--world-size", "4", "--plan.tp", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nothing is started" in out and "plan dp: dp2 tp2" in out
    assert "tp groups: [0, 1] [2, 3]" in out and "dp groups: [0, 2] [1, 3]" in out
    assert "memory per rank" in out and "predicted step on" in out and " ms (compute" in out


def test_dry_run_under_torchrun_shows_nodes(capsys, monkeypatch):
    for k, v in dict(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SIMLIB_WORKER", raising=False)
    assert cli.main(["train", "gpt", "--quick", "--plan.tp", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "torchrun's world of 4 (2 node(s))" in out and "(every group inside one node)" in out
    assert (
        cli.main(["train", "gpt", "--quick", "--plan.dp", "2", "--plan.tp", "2", "--plan.tp", "4", "--dry-run"]) == 2
    )  # the last flag wins: dp 2 x tp 4 = 8 is not this world of 4


def test_resume_and_checkpoints(tmp_path, capsys):
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000004"  # simlib.checkpoint's layout
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_text("")
    args = ["train", "gpt", "--quick", "--out", str(tmp_path / "run"), "--plan.checkpoint-every", "2"]
    spec = cli_train.resolve(_args(*args[1:]))
    assert spec.plans["dp"].checkpoint_dir == str(tmp_path / "run" / "checkpoints")
    from simlib import checkpoint

    assert checkpoint.latest(spec.plans["dp"].checkpoint_dir) == ckpt
    with pytest.raises(ValueError, match="add --resume"):
        cli_train._check_checkpoints(spec)
    spec.resume = True
    cli_train._check_checkpoints(spec)


def test_doctor_reports_the_launcher_and_world(capsys, monkeypatch):
    for k, v in dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", TORCHELASTIC_RUN_ID="x").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SIMLIB_WORKER", raising=False)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torchrun" in out and "rank 1 of 4 (local rank 1 of 2, 2 node(s)) started by torchrun" in out


def test_context_and_expert_plans_from_the_command_line():
    spec = cli_train.resolve(_args("gpt", "--quick", "--plan.cp", "2"))
    assert spec.world_size == 2 and spec.plans["dp"].cp == 2 and spec.plans["dp"].dp == 1  # cp fills the world
    spec = cli_train.resolve(_args("gpt", "--quick", "--world-size", "4", "--plan.cp", "2"))
    assert (spec.plans["dp"].dp, spec.plans["dp"].cp) == (2, 2)
    spec = cli_train.resolve(_args("gpt", "--quick", "--plan", "cp"))
    assert spec.plans["cp"].cp == 2
    spec = cli_train.resolve(
        _args("gpt", "--quick", "--plan.ep", "2", "--task.moe-experts", "4", "--task.moe-top-k", "2")
    )
    assert (spec.plans["dp"].dp, spec.plans["dp"].ep, spec.task.moe_experts, spec.task.moe_top_k) == (2, 2, 4, 2)
    with pytest.raises(ValueError, match="is dense.*--task.moe-experts"):
        cli_train.resolve(_args("gpt", "--quick", "--plan.ep", "2"))
    with pytest.raises(ValueError, match="not with tensor parallelism"):
        cli_train.resolve(_args("gpt", "--quick", "--world-size", "4", "--plan.cp", "2", "--plan.tp", "2"))


def test_sequence_parallel_from_the_command_line():
    spec = cli_train.resolve(_args("gpt", "--quick", "--plan.tp", "2", "--plan.sequence-parallel"))
    plan = spec.plans["dp"]
    assert (plan.tp, plan.sequence_parallel, plan.label) == (2, True, "tp2 sp")
    with pytest.raises(ValueError, match="but tp=1: use tp >= 2"):
        cli_train.resolve(_args("gpt", "--quick", "--plan.sequence-parallel"))


@pytest.mark.slow  # two launched runs of 2 steps: 82-86 s here at load ~15 (not measured idle)
def test_resume_at_the_last_step_finishes(tmp_path):
    """A restart after the final checkpoint (a node lost during the final eval, a requeued job) has no step left:
    it reports the run and ends without error (it failed plotting the training curve it no longer has)."""
    out = tmp_path / "run"
    args = [
        "train",
        "gpt",
        "--quick",
        "--world-size",
        "1",
        "--plan",
        "single",
        "--out",
        str(out),
        "--budget.steps",
        "2",
        "--budget.eval-every",
        "2",
        "--plan.checkpoint-every",
        "2",
    ]
    assert cli.main(args) == 0
    assert cli.main([*args, "--resume"]) == 0
    assert (out / "loss.png").is_file()
