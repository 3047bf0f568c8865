"""Checks for the hands-on projects' milestones. They read run records and recompute what they grade.

``gpt_plan`` (notebook 10): the learner names the 2-process plan that reached the target eval loss fastest,
among the runs the notebook made (``results/gpt/<plan>/``). The check never trusts a reported number it can
recompute: it loads the saved weights of that run and evaluates the held-out loss itself.
"""
from __future__ import annotations

from pathlib import Path

from . import Result, exercise

RESULTS = Path("results/gpt")


def _runs(root: Path) -> dict:
    from ..record import RunRecord
    runs = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        if (folder / "summary.json").exists():
            runs[folder.name] = RunRecord.load(folder)
    return runs


@exercise("gpt_plan")
def _gpt_plan(answer, grader, root=None):
    from ..projects.gpt.run import load_final_model

    root = Path(root) if root is not None else RESULTS
    runs = _runs(root)
    name = str(answer).strip()
    yield Result(f"a run of plan {name!r} is in {root}/", name in runs,
                 detail=f"found {sorted(runs)}" if runs else "no runs yet",
                 hint="answer with the folder name of one of the runs above, e.g. \"dp\" (run the training cells "
                      "first; they write results/gpt/<plan>/)")
    if name not in runs:
        return
    record = runs[name]
    s = record.summary
    yield Result("the plan uses 2 processes", s.get("world_size") == 2, detail=f"world size {s.get('world_size')}",
                 hint="the milestone compares plans for 2 processes: pick among the 2-process runs")
    if s.get("world_size") != 2:
        return
    if not (root / name / "final_model.pt").exists():
        yield Result("the run saved its final weights", False, hint="rerun the plan with project_gpt.run(...)")
        return
    task, model = load_final_model(root / name)
    recomputed = task.evaluate(model)["eval_loss"]
    reported = (s.get("final_eval") or {}).get("eval_loss")
    same = reported is not None and abs(recomputed - reported) <= 1e-3
    yield Result("the recorded eval loss is what the saved model scores", same,
                 detail=f"recomputed {recomputed:.4f}, recorded {reported}",
                 hint="the run record does not match its weights: rerun the plan instead of editing its files")
    target = (s.get("target") or {}).get("eval_loss")
    reached = target is not None and recomputed <= target and s.get("time_to_target") is not None
    yield Result("it reaches the target eval loss", reached, detail=f"eval loss {recomputed:.4f}, target {target}",
                 hint="this plan did not reach the target within the budget: pick a plan that did")
    if not reached:
        return
    rivals = {n: r.summary["time_to_target"] for n, r in runs.items()
              if r.summary.get("world_size") == 2 and r.summary.get("time_to_target") is not None}
    best = min(rivals, key=rivals.get)
    yield Result("it is the fastest 2-process plan to the target", rivals[name] <= rivals[best],
                 detail=f"{name}: {rivals[name]:.1f} s; fastest {best}: {rivals[best]:.1f} s",
                 hint="compare the time_to_target_s column of the table for the 2-process runs (training time "
                      "to the first evaluation at or below the target)")
