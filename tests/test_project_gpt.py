"""The GPT project: data and loader, the model's shapes, the unsplit weights of a TP run, the CLI, the milestone."""
import json
import sys

import cloudpickle
import pytest
import torch

from simlib.projects.gpt import GPTTask, text
from simlib.projects.gpt import run as project_gpt

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_global_batches_do_not_depend_on_the_split():
    task = GPTTask.quick()
    x, y = task.batch(5)
    parts = [task.batch(5, part=p, parts=4) for p in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    assert not torch.equal(task.batch(6)[0], x)
    with pytest.raises(ValueError, match="does not split into 3"):
        task.batch(0, part=0, parts=3)


def test_tokenizer_round_trip_and_unigram_level():
    sentence = "Exceptions are raised by the raise statement."
    assert text.decode(text.encode(sentence)) == sentence
    assert 5.0 < text.unigram_cross_entropy() < 7.0  # nats/token of a 1,024-token vocabulary on English prose


def test_gpt_shapes_and_parameter_count():
    task = GPTTask.quick()
    model = task.build_model()
    x, _ = task.batch(0)
    assert model(x).shape == (*x.shape, task.data.vocab_size)
    assert sum(p.numel() for p in model.parameters()) == task.config.num_parameters()
    assert model.generate(x[:1, :4], 5).shape == (1, 9)


def _tp_dense():
    import torch.distributed as dist

    from simlib.projects.gpt import model as gpt
    from simlib.train import OptimConfig, Plan, train
    task = GPTTask.quick()
    record = train(task, Plan(tp=2), steps=2, optim=OptimConfig(lr=1e-2), eval_every=2, verbose=False,
                   measure_memory=False)
    state = gpt.dense_state_dict(record.model.module, record.model.groups.tp_group)
    dense = task.build_model()
    dense.load_state_dict(state)
    dense.eval()
    return dist.get_rank(), record.evals[-1]["eval"]["eval_loss"], task.evaluate(dense)["eval_loss"]


def test_tensor_parallel_weights_gather_to_the_unsplit_model(cluster2):
    for rank, recorded, dense in cluster2.call(_tp_dense, timeout=60):
        assert abs(recorded - dense) < 1e-4, (rank, recorded, dense)


def test_cli_parses_train_gpt():
    from simlib.cli import build_parser
    args = build_parser().parse_args(["train", "gpt", "--world-size", "2", "--plan", "dp", "tp", "--quick"])
    assert (args.project, args.world_size, args.plan, args.quick) == ("gpt", 2, ["dp", "tp"], True)
    assert project_gpt.plan_for("pp", 2).pp == 2 and project_gpt.plan_for("dp+acc", 4).accumulation == 4
    with pytest.raises(ValueError, match="unknown plan"):
        project_gpt.plan_for("zero", 2)


# ── the milestone's check, on run folders made here (no training needed) ──
def _fake_run(root, name, world_size, time_to_target, tamper=0.0):
    task = GPTTask.quick()
    model = task.build_model().eval()
    folder = root / "results" / "gpt" / name
    folder.mkdir(parents=True)
    torch.save({"task": project_gpt._task_fields(task), "state": model.state_dict()}, folder / "final_model.pt")
    eval_loss = task.evaluate(model)["eval_loss"] + tamper
    summary = {"world_size": world_size, "final_eval": {"eval_loss": eval_loss}, "target": {"eval_loss": 8.0},
               "time_to_target": time_to_target}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run.jsonl").write_text(json.dumps({"step": 0, "eval": {"eval_loss": eval_loss}}) + "\n")


@pytest.fixture
def runs(tmp_path, monkeypatch):
    _fake_run(tmp_path, "dp", 2, 10.0)
    _fake_run(tmp_path, "tp", 2, 20.0)
    _fake_run(tmp_path, "pp", 2, 30.0, tamper=-0.5)   # its record claims a better loss than its weights give
    _fake_run(tmp_path, "single", 1, 3.0)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("answer, passed, failing", [
    ("dp", True, None),                       # the fastest honest 2-process run
    ("tp", False, "fastest"),                 # slower than dp
    ("pp", False, "what the saved model scores"),   # tampered record
    ("single", False, "2 processes"),         # not a 2-process plan
    ("dp+acc", False, "is in"),               # never run
])
def test_gpt_plan_milestone(runs, answer, passed, failing):
    from simlib import grading
    report = grading.check("gpt_plan", answer, quiet=True)
    assert report.passed == passed, [r.line() for r in report.results]
    if failing:
        assert any(failing in r.name for r in report.failed()), [r.line() for r in report.results]
