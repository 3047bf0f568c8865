"""Issue 33, family 7: milestones that took the learner's word. Each tampers with real gpt_plan run folders
(``results/gpt/<plan>/``, as tests/planted/projects.py) and returns the answer a learner would give."""

import json

import torch


def _evals(folder):
    return [json.loads(x) for x in (folder / "run.jsonl").read_text().splitlines() if "eval" in json.loads(x)]


def m7_rival_record_broken(root, fastest, slowest):
    """The faster plan's weights overwritten with garbage, so its run fails verification and is left out: the
    slower plan is then 'the fastest'."""
    (root / fastest / "final_model.pt").write_bytes(b"not a checkpoint")
    return slowest


def m7_untrained_intermediate_claim(root, fastest, slowest):
    """Untrained weights saved in the fastest plan's folder, the last evaluation edited to what they score (so
    weights and record agree), the first evaluation edited to claim the target."""
    from simlib.projects.gpt.task import GPTTask

    task = GPTTask.quick()
    model = task.build_model()
    torch.save({"state": model.state_dict()}, root / fastest / "final_model.pt")
    untrained = task.evaluate(model.eval())["eval_loss"]
    steps = sorted(e["step"] for e in _evals(root / fastest))
    first, last = steps[0], steps[-1]

    def edit(r):
        if "eval" in r and r["step"] == last:
            return dict(r, eval=dict(r["eval"], eval_loss=untrained))
        if "eval" in r and r["step"] == first:
            return dict(r, eval=dict(r["eval"], eval_loss=0.0))
        return r

    lines = [json.loads(x) for x in (root / fastest / "run.jsonl").read_text().splitlines()]
    (root / fastest / "run.jsonl").write_text("".join(json.dumps(edit(x)) + "\n" for x in lines))
    return fastest


GPT = [m7_rival_record_broken, m7_untrained_intermediate_claim]
HINTS = {"m7_rival_record_broken": "rerun those plans", "m7_untrained_intermediate_claim": "reach the target too"}


# ---- the plan, the time and the held-out text (issue 33, family 7's open part) ----
def _lines(folder):
    return [json.loads(x) for x in (folder / "run.jsonl").read_text().splitlines()]


def _write(folder, lines, summary):
    (folder / "run.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "summary.json").write_text(json.dumps(summary))


def _tta(lines, target):
    return next(
        (
            e["train_time"]
            for e in sorted((x for x in lines if "eval" in x), key=lambda e: e["step"])
            if e["eval"]["eval_loss"] <= target
        ),
        None,
    )


def _scale_times(lines, summary, factor):
    """Every time the trainer wrote, scaled by ``factor`` (consistently: rows, spans, evaluations, summary)."""
    out = []
    for x in lines:
        x = dict(x, train_time=x["train_time"] * factor)
        if "step_time" in x:
            x["step_time"] *= factor
            x["spans"] = {k: v * factor for k, v in x.get("spans", {}).items()}
        out.append(x)
    s = dict(summary)
    for k in (
        "train_time",
        "wall_time",
        "step_time",
        "step_time_iqr",
        "forward_time",
        "backward_time",
        "optimizer_time",
        "comm_time",
        "wait_time",
        "exposed_comm_time",
        "time_to_target",
    ):
        if isinstance(s.get(k), (int, float)):
            s[k] *= factor
    for k in ("tokens_per_s", "samples_per_s"):
        if isinstance(s.get(k), (int, float)):
            s[k] /= factor
    return out, s


def _faster_than(root, fastest, lines, summary, target, margin=0.5):
    """Scale the times so the run reaches the target at ``margin`` x the real fastest plan's time (if it does not
    already): a decisive win. An edit within the re-run's tolerance is not caught (simlib/grading/rerun.py)."""
    mine, best = _tta(lines, target), _tta(_lines(root / fastest), target)
    factor = min(1.0, margin * best / mine) if mine and best else 1.0
    return _scale_times(lines, summary, factor)


def m7_relabelled_single_everywhere(root, fastest, slowest, target):
    """The 1-process run copied into the 'pp' folder and relabelled in every field the trainer wrote (world size,
    plan, label, one matmul rate per rank, threads, a communication span in every step like a 2-process plan's),
    its times scaled (consistently) so that it reaches the target in half the fastest plan's time if it did not
    already."""
    from dataclasses import asdict

    from simlib.projects.gpt.run import plan_for

    real = json.loads((root / fastest / "summary.json").read_text())
    comm = {k: 0.0 for r in _lines(root / fastest) for k in r.get("spans", {})}
    (root / "pp").mkdir(exist_ok=True)
    for f in ("final_model.pt",):
        (root / "pp" / f).write_bytes((root / "single" / f).read_bytes())
    lines = [dict(x, spans={**comm, **x["spans"]}) if "spans" in x else x for x in _lines(root / "single")]
    summary = json.loads((root / "single" / "summary.json").read_text())
    plan = plan_for("pp", 2)
    summary.update(
        world_size=2,
        plan=asdict(plan),
        plan_label=plan.label,
        threads=real["threads"],
        matmul_gflops_per_rank=summary["matmul_gflops_per_rank"] * 2,
    )
    _write(root / "pp", *_faster_than(root, fastest, lines, summary, target))
    return "pp"


def m7_times_scaled_consistently(root, fastest, slowest, target):
    """The slower plan's every time field scaled down (rows, spans, evaluations, summary), so it reaches the
    target in a tenth of the fastest plan's time: a record edited consistently. (An edit within the re-run's time
    tolerance, about 5x under load here, passes: simlib/grading/rerun.py says so.)"""
    lines, summary = _lines(root / slowest), json.loads((root / slowest / "summary.json").read_text())
    _write(root / slowest, *_faster_than(root, fastest, lines, summary, target, margin=0.1))
    return slowest


def _finetune(root, plan, batches, steps):
    """The saved weights of ``plan`` trained ``steps`` more steps on ``batches(i)``; the last evaluation edited to
    what the new weights score (so weights and record agree)."""
    from simlib.projects.gpt.task import GPTTask

    task = GPTTask.quick()
    saved = torch.load(root / plan / "final_model.pt", weights_only=True)
    model = task.build_model()
    model.load_state_dict(saved["state"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for i in range(steps):
        x, y = batches(task, i)
        loss = task.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save({**saved, "state": model.state_dict()}, root / plan / "final_model.pt")
    new = task.evaluate(model.eval())["eval_loss"]
    lines = _lines(root / plan)
    last = max(x["step"] for x in lines if "eval" in x)
    lines = [dict(x, eval=dict(x["eval"], eval_loss=new)) if "eval" in x and x["step"] == last else x for x in lines]
    summary = json.loads((root / plan / "summary.json").read_text())
    summary["final_eval"] = {**(summary.get("final_eval") or {}), "eval_loss": new}
    _write(root / plan, lines, summary)
    return plan


def m7_trained_on_eval_windows(root, fastest, slowest, target):
    """The fastest plan's weights trained 20 more steps on the project's evaluation windows (its record's last
    evaluation edited to match): the fixed held-out windows were seen."""
    fixed = None

    def batches(task, i):
        nonlocal fixed
        fixed = fixed or list(task.data.eval_batches())
        return fixed[i % len(fixed)]

    return _finetune(root, fastest, batches, 20)


GPT_OPEN = [m7_relabelled_single_everywhere, m7_times_scaled_consistently, m7_trained_on_eval_windows]
OPEN_HINTS = {
    "m7_relabelled_single_everywhere": ("relabelled as this one", "was relabelled", "another plan ran under this name"),
    "m7_times_scaled_consistently": ("times were edited",),
    "m7_trained_on_eval_windows": ("held-out text itself",),
}


# ---- vision and finance: (task, record, state) -> (task, record, state), as tests/planted/projects.py ----
def _copy(record, rows=None, evals=None, summary=None):
    import copy

    rec = copy.copy(record)
    rec.rows = rows if rows is not None else [dict(r) for r in record.rows]
    rec.evals = evals if evals is not None else [dict(e, eval=dict(e["eval"])) for e in record.evals]
    rec.summary = {**record.summary, **(summary or {})}
    return rec


def m7_times_scaled(task, record, state):
    """Every time the trainer wrote scaled by 0.01, consistently (rows, spans, evaluations, summary): a run a
    hundred times slower than its record says (one over the budget would be made to fit this way). Smaller edits can
    pass: the check allows 2.5x against the re-run's fastest step, and load between the run and the check adds to
    that (at load ~19 on 2 cores a 10x edit of finance's record, steps of a few ms, passed once)."""
    lines, summary = _scale_times(record.rows + record.evals, record.summary, 0.01)
    return task, _copy(record, [x for x in lines if "eval" not in x], [x for x in lines if "eval" in x], summary), state


def m7_losses_of_another_run(task, record, state):
    """The logged losses after step 0 are not the standard run's (a run with its own learning rate or data after
    the first batch, whose step 0 still matches): here, 10 % lower."""
    rows = [dict(r, loss=r["loss"] * 0.9) if r["step"] > 0 else dict(r) for r in record.rows]
    return task, _copy(record, rows), state


VISION = [m7_times_scaled, m7_losses_of_another_run]
FINANCE = [m7_times_scaled, m7_losses_of_another_run]
OPEN_HINTS.update({"m7_times_scaled": ("times were edited",), "m7_losses_of_another_run": ("record's losses are not",)})
