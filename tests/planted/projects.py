"""Wrong milestone answers for the projects.

Vision and finance: each takes the good ``(task, record, state)`` of a real 2-process run and breaks one thing, as a
learner would (a forged record, a model or data of the learner's own, an answer left empty).
GPT (``gpt_plan``): each takes the folder of real runs (``results/gpt/<plan>/``) and the name of the fastest and
slowest plan, tampers with the files as a learner could, and returns the answer it would give.
"""

import copy
import dataclasses
import json
import shutil

import torch

from simlib.grading.evidence import first_loss


def _record(record, summary=None, rows=None, evals=None):
    rec = copy.copy(record)
    rec.summary = {**record.summary, **(summary or {})}
    rec.rows = rows if rows is not None else [dict(r) for r in record.rows]
    rec.evals = evals if evals is not None else [dict(e, eval=dict(e["eval"])) for e in record.evals]
    return rec


# ---- vision and finance: (task, record, state) -> (task, record, state) ----
def untrained(task, record, state):
    return task, record, {k: v.clone() for k, v in task.build_model().state_dict().items()}


def single_process(task, record, state):
    return (
        task,
        _record(
            record,
            {
                "world_size": 1,
                "plan": {**record.summary["plan"], "dp": 1},
                "matmul_gflops_per_rank": record.summary["matmul_gflops_per_rank"][:1],
            },
        ),
        state,
    )


def over_budget(task, record, state):
    rows = [dict(r, train_time=r["train_time"] * 1e4) for r in record.rows]
    evals = [dict(e, train_time=e["train_time"] * 1e4) for e in record.evals]
    return task, _record(record, {"train_time": record.summary["train_time"] * 1e4}, rows, evals), state


def stale_running_stats(task, record, state):
    out = {k: v.clone() for k, v in state.items()}
    for k in out:
        if k.endswith("running_mean"):
            out[k].zero_()
        elif k.endswith("running_var"):
            out[k].fill_(1.0)
    return task, record, out


# forged records: a run that fails made to look as if it passed
def relabelled_world_size(task, record, state):
    """A 1-process run whose summary was edited to say world size 2 (the plan and per-rank reports say 1)."""
    return (
        task,
        _record(
            record,
            {
                "plan": {**record.summary["plan"], "dp": 1},
                "matmul_gflops_per_rank": record.summary["matmul_gflops_per_rank"][:1],
            },
        ),
        state,
    )


def edited_train_time(task, record, state):
    """An over-budget run whose summary's train_time was edited down (its rows still say how long it took)."""
    rows = [dict(r, train_time=r["train_time"] * 1e4) for r in record.rows]
    evals = [dict(e, train_time=e["train_time"] * 1e4) for e in record.evals]
    return task, _record(record, {"train_time": 1.0}, rows, evals), state


def forged_last_eval(task, record, state):
    """Untrained weights with the good run's record (its evaluations claim what they do not score)."""
    return untrained(task, record, state)


# the learner supplies the model or the data
def model_of_its_own(task, record, state):
    """Weights of a model of the learner's own (a lookup table of answers), not the project's."""
    return task, record, {**state, "answers": torch.zeros(450, dtype=torch.long)}


def a_module_not_weights(task, record, state):
    """The trained module itself (its code would run in the grader), not a state_dict."""
    model = task.build_model()
    model.load_state_dict(state)
    return task, record, model


def trained_on_test_split(task, record, state):
    """A run that trained on more digits (holdout 0.05 takes most held-out digits into training)."""
    rows = [dict(r) for r in record.rows]
    rows[0]["loss"] = first_loss(dataclasses.replace(task, holdout=0.05))
    return dataclasses.replace(task, holdout=0.05), _record(record, rows=rows), state


def calibrated_on_test_years(task, record, state):
    """A run whose simulator was calibrated on prices up to 2018 (the test years): the record's first loss
    is that task's."""
    cheat = dataclasses.replace(task, train_end="2018-12-31")
    rows = [dict(r) for r in record.rows]
    rows[0]["loss"] = first_loss(cheat)
    return cheat, _record(record, rows=rows), state


def no_costs(task, record, state):
    cheat = dataclasses.replace(task, cost=0.0)
    rows = [dict(r) for r in record.rows]
    rows[0]["loss"] = first_loss(cheat)
    return cheat, _record(record, rows=rows), state


def sees_tomorrow(task, record, state):
    """A hedge whose network also reads the next day's return (a fifth input): its first layer has 5 columns."""
    out = {k: v.clone() for k, v in state.items()}
    w = out["net.0.weight"]
    out["net.0.weight"] = torch.cat([w, torch.zeros(w.shape[0], 1)], 1)
    return task, record, out


def returns_the_payoff(task, record, state):
    """A 'hedge' whose forward returns the option's payoff: its weights are not a HedgeNet's."""
    return task, record, {"strike": torch.ones(1)}


def not_done(task, record, state):
    return None


VISION = [
    untrained,
    single_process,
    stale_running_stats,
    trained_on_test_split,
    over_budget,
    relabelled_world_size,
    edited_train_time,
    forged_last_eval,
    model_of_its_own,
    a_module_not_weights,
    not_done,
]
FINANCE = [
    untrained,
    single_process,
    calibrated_on_test_years,
    no_costs,
    relabelled_world_size,
    edited_train_time,
    forged_last_eval,
    sees_tomorrow,
    returns_the_payoff,
    a_module_not_weights,
    not_done,
]
HINTS = {
    "untrained": ("train longer", "untrained HedgeNet", "same run"),
    "single_process": ("2 processes",),
    "over_budget": ("fewer steps",),
    "stale_running_stats": ("running averages",),
    "trained_on_test_split": ("another split",),
    "calibrated_on_test_years": ("calibration period",),
    "no_costs": ("project's first global batch",),
    "relabelled_world_size": ("it was edited",),
    "edited_train_time": ("fewer steps",),
    "forged_last_eval": ("same run",),
    "model_of_its_own": ("not the project's model",),
    "a_module_not_weights": ("as a state_dict",),
    "sees_tomorrow": ("not the project's model",),
    "returns_the_payoff": ("not the project's model",),
    "not_done": ("not done yet",),
}


# ---- gpt_plan: (root, fastest, slowest) -> answer; root holds results/gpt/<plan>/ of real runs ----
def _rewrite_jsonl(folder, change):
    lines = [json.loads(x) for x in (folder / "run.jsonl").read_text().splitlines()]
    (folder / "run.jsonl").write_text("".join(json.dumps(change(x)) + "\n" for x in lines))


def _rewrite_summary(folder, **fields):
    s = json.loads((folder / "summary.json").read_text())
    s.update(fields)
    (folder / "summary.json").write_text(json.dumps(s))


def edited_summary(root, fastest, slowest):
    """The slower plan's summary says it reached a loosened target first."""
    _rewrite_summary(root / slowest, time_to_target=0.0, target={"eval_loss": 100.0})
    return slowest


def edited_eval_times(root, fastest, slowest):
    """The slower plan's evaluations claim a hundredth of their training time (the step rows still tell)."""
    _rewrite_jsonl(root / slowest, lambda r: dict(r, train_time=r["train_time"] / 100) if "eval" in r else r)
    return slowest


def relabelled_single(root, fastest, slowest):
    """The 1-process run copied into a 2-process plan's folder, its summary edited to say 2 processes."""
    shutil.rmtree(root / "pp", ignore_errors=True)
    shutil.copytree(root / "single", root / "pp")
    from dataclasses import asdict

    from simlib.projects.gpt.run import plan_for

    _rewrite_summary(root / "pp", world_size=2, plan=asdict(plan_for("pp", 2)))
    return "pp"


def another_models_weights(root, fastest, slowest):
    """Weights of a bigger GPT of the learner's own saved with the fastest run's record."""
    from simlib.projects.gpt.task import GPTTask

    big = GPTTask.quick(hidden=128)
    torch.save({"task": {}, "state": big.build_model().state_dict()}, root / fastest / "final_model.pt")
    return fastest


def a_pickled_module(root, fastest, slowest):
    """The whole model object saved (its code would run in the grader on load), not a state_dict."""
    from simlib.projects.gpt.task import GPTTask

    torch.save(GPTTask.quick().build_model(), root / fastest / "final_model.pt")
    return fastest


def another_task_record(root, fastest, slowest):
    """A run of another task (another seed) in the fastest plan's folder: its step-0 loss is not the project's."""
    from simlib.projects.gpt.task import GPTTask

    other = first_loss(GPTTask.quick(seed=1))
    _rewrite_jsonl(root / fastest, lambda r: dict(r, loss=other) if r.get("step") == 0 and "loss" in r else r)
    return fastest


def untrained_weights(root, fastest, slowest):
    from simlib.projects.gpt.task import GPTTask

    torch.save({"state": GPTTask.quick().build_model().state_dict()}, root / fastest / "final_model.pt")
    return fastest


def prefilled(root, fastest, slowest):
    return None


def empty(root, fastest, slowest):
    return ""


GPT = [
    edited_summary,
    edited_eval_times,
    relabelled_single,
    another_models_weights,
    a_pickled_module,
    another_task_record,
    untrained_weights,
    prefilled,
    empty,
]
GPT_HINTS = {
    "edited_summary": ("time_to_target_s",),
    "edited_eval_times": ("editing its files",),
    "relabelled_single": ("it was edited",),
    "another_models_weights": ("not the project's model",),
    "a_pickled_module": ("saves final_model.pt",),
    "another_task_record": ("project's first global batch",),
    "untrained_weights": ("does not match its weights",),
    "prefilled": ("not done yet",),
    "empty": ("not done yet",),
}
