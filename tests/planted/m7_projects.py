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
