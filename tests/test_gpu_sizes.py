"""The projects' GPU size (simlib.projects.gpu), checked on a CPU: the presets' shapes and precision by GPU, one
step of each at a reduced size, the CLI's --size / [task] size / automatic choice, fused AdamW, compile fallback."""

import dataclasses

import pytest
import torch

from simlib.projects import gpu, registry

H200 = [{"name": "NVIDIA H200", "memory_gib": 139.8, "capability": (9, 0)}]
T4 = [{"name": "Tesla T4", "memory_gib": 15.0, "capability": (7, 5)}]


def test_gpt_preset_is_gpt2_layout_at_hidden_1536_in_bf16_or_fp16_by_the_gpu():
    big, small = registry.get("gpt").size("gpu", 1, H200), registry.get("gpt").size("gpu", 1, T4)
    task = big["task"]
    assert (task.num_layers, task.hidden, task.num_heads, task.seq_len) == (12, 1536, 12, 1024)
    assert task.hidden % 128 == 0 and task.hidden // task.num_heads == 128 and task.compile  # issue 50's shape rules
    assert big["plan"]["mixed_precision"] == "bf16" and small["plan"]["mixed_precision"] == "fp16"
    # micro-batches by memory: 16 windows a pass on an H200, 4 on a T4; the global batch stays 64 windows
    assert big["plan"]["accumulation"] == 4 and small["plan"]["accumulation"] == 16
    assert task.global_batch == 64 and big["seconds"] == gpu.GPU_SECONDS and big["optim"].schedule == "constant"
    assert big["target"]["eval_loss"] < task.data.unigram_cross_entropy()  # a goal below the baseline
    # the count MFU divides by: the model built on the meta device has exactly num_parameters() weights
    from simlib.projects.gpt.model import GPT

    with torch.device("meta"):
        model = GPT(task.config)
    assert sum(p.numel() for p in model.parameters()) == task.config.num_parameters() > 300e6
    assert task.flops_per_sample == task.config.flops_per_token() * 1024 > 6 * 300e6 * 1024


@pytest.mark.parametrize("project", list(registry.PROJECTS))
def test_each_gpu_preset_takes_a_step_on_cpu_at_a_reduced_size(project, tmp_path):
    from simlib.projects.runner import run_project

    preset = registry.get(project).size("gpu", 1, [])  # no GPU: bf16, which CPU autocast runs
    small = {
        "gpt": dict(seq_len=32, hidden=32, num_layers=2, num_heads=2, global_batch=4, eval_windows=2),
        "vision": dict(global_batch=8, image_size=16, width=4),
        "finance": dict(global_batch=256, block=128, hidden=8),
    }.get(project, {})  # a project without its reduced size here takes a step at its own
    task = dataclasses.replace(preset["task"], **small)
    plan = preset.get("plan", {})
    fields = {**plan, "accumulation": min(plan.get("accumulation", 1), 2)}
    from simlib.train import Plan

    record, _ = run_project(
        project,
        1,
        size="gpu",
        task=task,
        plan=Plan(**fields),
        steps=2,
        eval_every=2,
        seconds=None,
        log_every=1,
        warmup=1,
        verbose=False,
        out_dir=tmp_path,
        threads=1,
    )
    assert record.summary["steps"] == 2 and record.summary["plan"]["mixed_precision"] == plan.get("mixed_precision")
    assert record.summary["final_eval"] and record.summary["mfu_flops"]  # what MFU needs: dtype and FLOPs


def test_vision_and_finance_presets_are_gpu_sized():
    v, f = registry.get("vision").size("gpu", 1, T4), registry.get("finance").size("gpu", 1, H200)
    assert (
        v["task"].flops_per_sample
        > 100 * dataclasses.replace(v["task"], image_size=16, width=16, blocks_per_stage=1).flops_per_sample
    )
    assert v["plan"]["mixed_precision"] == "fp16" and v["target"]["accuracy"] > 0.9
    assert f["task"].global_batch == 256 * 512 and f["target"]["eval_loss"] > 0  # 256x the CPU size's paths


def test_auto_size_needs_a_gpu_per_rank():
    assert gpu.auto_size(2, 2, gpus=0)[0] == "full"
    size, why = gpu.auto_size(2, 2, gpus=1)
    assert size == "full" and "GPU of its own" in why
    assert gpu.auto_size(2, 2, "gloo", gpus=2)[0] == "full"
    size, why = gpu.auto_size(2, 2, gpus=2)
    assert size == "gpu" and "--size full" in why


def test_pick_size_precedence_and_conflicts():
    from simlib.config import pick_size

    size, why = pick_size("gpu", None, False, True, 1, 1)  # --size beats SIMLIB_QUICK
    assert size == "gpu" and (why == "" if torch.cuda.is_available() else "the ranks run on the CPU" in why)
    assert pick_size(None, "full", False, False, 1, 1) == ("full", "")
    assert pick_size(None, None, False, True, 1, 1) == ("quick", "")
    with pytest.raises(ValueError, match="give one of them"):
        pick_size("gpu", None, True, False, 1, 1)
    with pytest.raises(ValueError, match="use one of quick, full, gpu"):
        pick_size("huge", None, False, False, 1, 1)


def _resolve(argv):
    from simlib import cli, cli_train
    from simlib.config import normalize_argv

    return cli_train.resolve(cli.build_parser().parse_args(normalize_argv(argv)))


def test_cli_size_gpu_and_the_toml_preset_round_trip(tmp_path):
    spec = _resolve(["train", "gpt", "--size", "gpu", "--world-size", "1", "--budget.steps", "5"])
    plan = spec.plans["dp"]
    assert spec.size == "gpu" and spec.task.num_layers == 12 and plan.mixed_precision == "bf16"
    assert spec.budget["steps"] == 5 and spec.budget["seconds"] is None  # a budget flag replaces seconds
    assert spec.config["dp"]["task"]["size"] == "gpu"
    from simlib import config as cfg

    path = tmp_path / "config.toml"
    cfg.dump(spec.config["dp"], path)
    again = _resolve(["train", "--config", str(path)])
    assert again.size == "gpu" and again.plans["dp"] == plan and again.task.hidden == 1536
    bad = tmp_path / "bad.toml"
    bad.write_text('[run]\nproject = "gpt"\n[task]\nsize = "huge"\n')
    with pytest.raises(ValueError, match="size = 'huge'"):
        _resolve(["train", "--config", str(bad)])


def test_cli_chooses_the_gpu_size_when_every_rank_has_a_gpu_and_says_so(monkeypatch, capsys):
    from simlib import env

    monkeypatch.delenv("SIMLIB_QUICK", raising=False)
    for name in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):  # left by an in-process run of this session
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(env, "gpu_count", lambda: 2)
    spec = _resolve(["train", "vision", "--world-size", "2"])
    assert spec.size == "gpu" and "GPU of its own" in spec.size_reason and spec.task.image_size == 64
    from simlib.cli_train import _announce

    _announce(spec, "dp", spec.plans["dp"])
    assert "size gpu: every one of the 2 rank(s) has a GPU of its own" in capsys.readouterr().out
    monkeypatch.setattr(env, "gpu_count", lambda: 1)  # 2 ranks, 1 GPU: the CPU size
    assert _resolve(["train", "vision", "--world-size", "2"]).size == "full"


def test_fused_adamw_only_where_every_parameter_is_on_a_gpu():
    from simlib.parallelize import fused_adamw

    cpu = [torch.nn.Parameter(torch.zeros(2))]
    assert fused_adamw(torch.optim.AdamW, cpu) == {} and fused_adamw(torch.optim.SGD, cpu) == {}


def test_compile_falls_back_to_eager_with_one_line_and_the_same_output(capsys):
    from simlib.projects.gpt.model import GPT, GPTConfig, compile_blocks

    cfg = GPTConfig(vocab_size=64, seq_len=8, hidden=16, num_layers=2, num_heads=2)
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    reference = GPT(cfg)(idx)

    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler here")

    model = GPT(cfg)
    compile_blocks(model, backend=broken)
    out = model(idx)
    assert torch.allclose(out, reference)
    err = capsys.readouterr().err
    assert "torch.compile failed" in err and "no C++ compiler here" in err and "runs eagerly" in err
    works = GPT(cfg)
    compile_blocks(works, backend="eager")  # a backend that works: no message
    assert torch.allclose(works(idx), reference) and capsys.readouterr().err == ""
    assert list(works.state_dict()) == list(GPT(cfg).state_dict())  # in place: same keys for checkpoints


def test_batches_made_on_the_gpu_fall_back_to_the_cpu_with_the_same_samples():
    from simlib.projects import data_device
    from simlib.projects.finance import HedgingTask
    from simlib.projects.vision import DigitsTask

    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        DigitsTask(augment_on="tpu")
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU fallback")
    assert data_device("cuda").type == "cpu"
    a, b = DigitsTask(global_batch=8), DigitsTask(global_batch=8, augment_on="cuda")
    assert torch.equal(a.batch(3)[0], b.batch(3)[0])
    f, g = HedgingTask(global_batch=64, block=32), HedgingTask(global_batch=64, block=32, paths_on="cuda")
    assert torch.equal(f.batch(2)[0], g.batch(2)[0]) and torch.equal(f.test_paths(64), g.test_paths(64))


def test_gpu_facts_read_from_nvidia_smi_without_touching_cuda(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf \'NVIDIA H200, 143771, 9.0\\nTesla T4, 15360, 7.5\\n\'\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    facts = gpu.gpu_facts()
    assert [f["capability"] for f in facts] == [(9, 0), (7, 5)] and round(facts[1]["memory_gib"]) == 15
    assert "-i 0,3" in (tmp_path / "args").read_text()  # SLURM's mask is passed on
    assert gpu.precision_for(facts) == "fp16" and gpu.micro_batch_for(facts) == 4  # the smallest GPU decides
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.gpu_facts() == []


def test_task_corpus_folder_gets_its_own_target(tmp_path):
    """Issue 50 (3): `--task.corpus FOLDER` (what `simlib prepare` prints) sets the goal from that folder's unigram
    baseline, not from the shipped corpus's; a target given with --budget.target still wins."""
    from simlib.projects.gpt import prepare, text

    src = tmp_path / "stories.txt"
    import random

    words = "once upon a time little fox found ball she played all day and was happy tom boat sun warm".split()
    rng = random.Random(0)  # varied text: the 1 % held out must hold a window of 1,024 tokens
    src.write_text("\n".join(" ".join(rng.choices(words, k=12)) for _ in range(30000)) + "\n")
    folder = prepare.prepare(str(src), tmp_path / "stories", vocab_size=280, log=lambda *_: None)
    own = round(0.4 * text.read_meta(folder)["unigram_cross_entropy"], 2)
    shipped = _resolve(["train", "gpt", "--size", "gpu", "--world-size", "1"]).budget["target"]["eval_loss"]
    spec = _resolve(["train", "gpt", "--size", "gpu", "--world-size", "1", "--task.corpus", str(folder)])
    assert spec.task.corpus == str(folder) and spec.budget["target"] == {"eval_loss": own} and own != shipped
    given = ["train", "gpt", "--size", "gpu", "--world-size", "1", "--task.corpus", str(folder)]
    spec = _resolve(given + ["--budget.target", "eval_loss=9.5"])
    assert spec.budget["target"] == {"eval_loss": 9.5}


def test_every_switch_of_the_gpu_size_is_wired_and_compiles_on_cpu_at_a_tiny_size(capsys):
    """Issue 50: the GPU size's run, dry (bf16, per-block compile, accumulation by memory, predicted on the H100's
    preset), and the torch reference's compiled path (torch.compile of the whole GPT, fused AdamW, bf16 autocast,
    SDPA) at a tiny size on this CPU: it runs and counts MFU with the course's code."""
    from simlib.dry_run import dry_run
    from simlib.lessons.one_device import plain_loop
    from simlib.projects.gpt.model import GPTConfig

    spec = _resolve(["train", "gpt", "--size", "gpu", "--world-size", "1", "--dry-run", "--hardware", "h100"])
    plan = spec.plans["dp"]
    assert spec.task.compile and plan.mixed_precision == "bf16" and spec.task.hidden % 128 == 0
    assert dry_run(spec) == 0 and "predicted step on DGX H100" in capsys.readouterr().out
    config = GPTConfig(vocab_size=128, seq_len=32, hidden=64, num_layers=2, num_heads=4)
    ref = plain_loop(config, micro_batch=2, device="cpu", seconds=0.0, warmup=2, compile="blocks")
    assert ref["compiled"] and ref["fused_adamw"] and ref["dtype"] == "bf16" and ref["steps"] >= 3
    assert 0 < ref["mfu"] < 1
