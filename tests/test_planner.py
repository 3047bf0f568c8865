"""The planner (simlib.sim.planner): its prices are sim.predict's, its validity the trainer's and Strategy's,
and its TOML is what ``simlib train --config`` reads back into the same Plan. Pure Python, a few seconds."""

from __future__ import annotations

import random
import subprocess

import pytest

from simlib import sim
from simlib.sim import plan_result, planner, planner_trainer

# the shared search's space: every dimension searched, fewer values of the costliest (these tests check what the
# planner does with a search, not its scale: benchmarks/planner_speed.py times full searches)
SHARED = dict(recompute=("none", "full"), tp_overlap=(False,), max_micro_batch=2, max_virtual_stages=4)


@pytest.fixture(scope="module")
def search70():
    return sim.plan("70B", "h100", nodes=16, global_batch=256, space=SHARED)


def test_fast_prices_equal_predict(search70):
    """Every term the planner ranks by is sim.predict's, to 1e-9, on 60 plans drawn from the search."""
    rng = random.Random(0)
    entries = rng.sample(search70.ranked, 60)
    for e in entries:
        p = sim.predict(search70.model, search70.hardware, e["strategy"])
        assert e["step_time"] == pytest.approx(p.step_time, rel=1e-9), planner.label(e["strategy"])
        assert e["bubble"] == pytest.approx(p.bubble, rel=1e-9, abs=1e-12)
        assert e["exposed_comm"] == pytest.approx(p.exposed_comm, rel=1e-9, abs=1e-12)
        assert e["memory"]["total"] == pytest.approx(p.memory["total"], rel=1e-12)
        assert e["mfu"] == pytest.approx(p.mfu, rel=1e-9)


def test_interleaved_stages_of_uneven_layers_are_priced_as_predict():
    """405B (126 layers) on pp=4 interleaved v=2: Megatron's split counts embedding and loss as layers (128 / 8
    chunks), which Strategy accepts; the fast pricing priced its stage as if v = 1 and raised (126 % 4 != 0)."""
    from simlib.sim.planner_cost import FastPricer

    m, hw = plan_result.resolve_model("405B"), sim.preset("h100")
    s = sim.Strategy(
        dp=512,
        tp=8,
        pp=4,
        micro_batch=1,
        num_micro_batches=4,
        schedule="interleaved",
        virtual_stages=2,
        attention="flash",
        recompute="full",
    ).validate(16384, m, hw)
    fast = FastPricer(m, hw).price(s, 2048)
    assert fast["step_time"] == pytest.approx(sim.predict(m, hw, s).step_time, rel=1e-9)


def test_ranked_fit_and_rejected_do_not(search70):
    r = search70
    assert r.ranked and r.too_big and r.refused
    times = [e["step_time"] for e in r.ranked]
    assert times == sorted(times) or all(b >= a * (1 - 1e-4) for a, b in zip(times, times[1:]))
    assert all(e["memory"]["total"] <= r.memory_limit for e in r.ranked)
    assert all(e["excess"] > 0 and e["memory"]["total"] > r.memory_limit for e in r.too_big)
    assert r.considered == len(r.ranked) + len(r.too_big) + sum(r.refused.values()) + r.extra.get("duplicates", 0)


def test_refusals_are_strategy_messages():
    """What the planner refuses, Strategy refuses with the same words (no second copy of the rules)."""
    r = sim.plan("70B", "h100", nodes=4, global_batch=64, space=NARROW)
    msg = next(m for m in r.refused if "spans more than one node" in m)
    with pytest.raises(ValueError, match="spans more than one node"):
        sim.Strategy(dp=2, tp=16).validate(32, r.model, r.hardware)
    assert msg.startswith("tp = 16") or msg.startswith("tp = 32")


def test_trainer_plan_maps_back():
    """A plan simlib train runs maps back to the same Strategy (``from_plan`` gives the course GPT's whole head;
    the head is how a model is built, not a knob of the plan: a search for a named model keeps Megatron's); one
    with FSDP names the missing knob."""
    s = sim.Strategy(dp=2, tp=2, pp=2, micro_batch=1, num_micro_batches=4, zero_stage=1, recompute="full", head="whole")
    plan, why = planner_trainer.trainer_plan(s, 8, 8)
    assert why == "" and (plan.dp, plan.tp, plan.pp, plan.pp_microbatches, plan.zero_stage) == (2, 2, 2, 4, 1)
    assert sim.Strategy.from_plan(plan, 8) == s
    assert planner_trainer.trainer_plan(s.replace(head="parallel"), 8, 8)[0] == plan
    plan, why = planner_trainer.trainer_plan(s.replace(tp=1, pp=1, dp=8, zero_stage=3, fsdp=True), 32, 8)
    assert plan is None and "fsdp=True" in why


NARROW = dict(
    zero_stage=(1,),
    recompute=("full",),
    fsdp=(False,),
    schedule=("1f1b",),
    max_micro_batch=1,
    tp_overlap=(False,),
    overlap=(True,),
)


def _agree_with_predict(r, entries):
    for e in entries:
        p = sim.predict(r.model, r.hardware, e["strategy"])
        assert e["step_time"] == pytest.approx(p.step_time, rel=1e-9), planner.label(e["strategy"])
        for k in ("cp_comm", "ep_comm", "pp_comm", "tp_comm"):
            assert e[k] == pytest.approx(p.breakdown.get(k, 0.0), rel=1e-9, abs=1e-12), k
        assert e["memory"]["total"] == pytest.approx(p.memory["total"], rel=1e-12)


def test_long_context_searches_cp():
    """An 8B at 131,072 tokens on 64 H100s: context parallelism (every cp_kind) is searched and ranked, priced
    as sim.predict prices it (pipeline messages carry seq/cp tokens), and nothing is said to be 'not searched'."""
    r = sim.plan(sim.llama_size("llama3-8b", 131072), "h100", nodes=8, global_batch=64, space=NARROW)
    cps = [e for e in r.ranked if e["strategy"].cp > 1]
    assert cps and r.best["strategy"].cp > 1 and not r.notes
    assert {e["strategy"].cp_kind for e in cps} == {"allgather", "ring", "ulysses"}
    _agree_with_predict(r, cps[:3] + [e for e in cps if e["strategy"].pp > 1][:3] + cps[-2:])
    assert any(e["cp_comm"] > 0 for e in cps)


def test_moe_searches_ep():
    """qwen3-30b-a3b on 64 H100s: expert parallelism over the degrees Strategy accepts is searched and ranked,
    its all-to-all priced as sim.predict prices it; an ep the experts do not split over is refused by Strategy."""
    r = sim.plan(
        "qwen3-30b-a3b", "h100", nodes=8, global_batch=64, seq_len=4096, space={**NARROW, "cp_kind": ("ring",)}
    )
    eps = [e for e in r.ranked if e["strategy"].ep > 1]
    assert eps and not r.notes
    assert any(e["ep_comm"] > 0 for e in eps)
    _agree_with_predict(r, eps[:3] + eps[-2:])
    seen = [e["strategy"] for e in r.ranked + r.too_big]
    assert {2, 4, 8, 16, 32, 64} <= {s.ep for s in seen}
    assert any(s.ep > s.dp * s.cp for s in seen)  # Megatron's MoE parallel folding (tp ranks join ep)
    dense = sim.plan("8B", "h100", nodes=1, global_batch=16, space=NARROW)
    assert all(e["strategy"].ep == 1 for e in dense.ranked)


EQUIVALENCE = {  # (model, cluster), search: small enough to search exhaustively in a test, wide enough to prune
    "moe": (
        ("qwen3-30b-a3b", "h100"),
        dict(
            nodes=1,
            global_batch=16,
            seq_len=4096,
            space=dict(recompute=("none", "full"), max_micro_batch=2, tp_overlap=(False,)),
        ),
    ),
    "dense": (
        ("8B", "h100"),
        dict(nodes=2, global_batch=32, space=dict(recompute=("none", "full"), max_micro_batch=2, tp_overlap=(False,))),
    ),
}


@pytest.mark.parametrize("case", sorted(EQUIVALENCE))
def test_top_k_search_equals_the_exhaustive_one(case):
    """plan(top=k) skips layouts whose lower bound on step time (FastPricer.floor/bound) passes the k-th best
    found: it must return the exhaustive search's first k plans, in the same order, at the same times, having
    skipped a good part of the search (every combination still accounted for)."""
    args, kw = EQUIVALENCE[case]
    full = sim.plan(*args, **kw)
    for k in (1, 10):
        pruned = sim.plan(*args, top=k, **kw)
        assert [e["strategy"] for e in pruned.ranked] == [e["strategy"] for e in full.ranked[:k]]
        assert [e["step_time"] for e in pruned.ranked] == [e["step_time"] for e in full.ranked[:k]]
        assert [e["memory"]["total"] for e in pruned.ranked] == [e["memory"]["total"] for e in full.ranked[:k]]
        assert pruned.considered == full.considered and pruned.refused.keys() <= full.refused.keys()
        assert pruned.pruned > 0.5 * full.considered, (pruned.pruned, full.considered)
        assert pruned.considered == (
            pruned.extra["priced"]
            + len(pruned.too_big)
            + sum(pruned.refused.values())
            + pruned.extra["duplicates"]
            + pruned.pruned
        )
    # the report's "faster, but over the memory limit" loses nothing: such plans are in the layouts visited (it
    # may find more: it prices the 300 closest to fitting, and the pruned search has fewer to choose from)
    from simlib.sim.planner_report import faster_but_too_big

    assert {e["strategy"] for e in faster_but_too_big(full)} <= {e["strategy"] for e in faster_but_too_big(pruned)}
    with pytest.raises(ValueError, match="top must be an int"):
        sim.plan(*args, top=0, **kw)


def test_nothing_fits_says_by_how_much():
    r = sim.plan("405B", "h100", nodes=1, global_batch=8)
    assert not r.ranked
    with pytest.raises(ValueError, match="GB per device"):
        r.best


def test_toml_parses_in_simlib_train(tmp_path, search70):
    """The TOML is read by simlib train's own resolver into the very Plan the planner chose."""
    from simlib import cli, cli_train

    entry = search70.best_runnable
    path = tmp_path / "plan.toml"
    path.write_text(search70.toml())
    args = cli.build_parser().parse_args(["train", "--config", str(path), "--dry-run"])
    spec = cli_train.resolve(args)
    (plan,) = spec.plans.values()
    assert plan == entry["plan"]
    assert spec.world_size == search70.world_size and spec.task.global_batch == search70.global_batch
    script = tmp_path / "run.sbatch"
    script.write_text(search70.sbatch(str(path)))
    assert "#SBATCH --nodes=16" in script.read_text() and f"--config {path}" in script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)  # the script parses


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="unknown model"):
        sim.plan("9B")
    with pytest.raises(ValueError, match="global_batch"):
        sim.plan("8B", global_batch=0)


def test_fast_path_out_of_step_falls_back_to_predict(monkeypatch):
    """If the cached pricing ever disagrees with sim.predict (the simulator changed), every plan is re-priced
    by predict and the result says so: no silently wrong ranking."""
    from simlib.sim import planner_cost

    real = planner_cost.FastPricer.price

    def off_by_a_bit(self, s, global_batch):
        out = real(self, s, global_batch)
        if not self.exact:
            out["step_time"] *= 1.01
        return out

    monkeypatch.setattr(planner_cost.FastPricer, "price", off_by_a_bit)
    r = sim.plan(
        "8B",
        "h100",
        nodes=1,
        global_batch=16,
        space=dict(recompute=("full",), max_micro_batch=2, tp_overlap=(False,), schedule=("1f1b",)),
    )
    assert r.exact and any("re-priced by sim.predict" in n for n in r.notes)
    p = sim.predict(r.model, r.hardware, r.best["strategy"])
    assert r.best["step_time"] == pytest.approx(p.step_time, rel=1e-12)


def test_cli_writes_the_files(tmp_path, capsys):
    import pandas as pd

    from simlib import cli

    rc = cli.main(
        ["plan", "8B", "--nodes", "1", "--global-batch", "16", "--max-pp", "2", "--zero", "1", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "best plans" in out
    assert {p.name for p in tmp_path.iterdir()} == {"plans.csv", "plan.toml", "plan.sbatch"}
    rows = pd.read_csv(tmp_path / "plans.csv")  # the narrowing flags held, end to end
    assert len(rows) and (rows.pp <= 2).all() and (rows.zero == 1).all()
    assert cli.main(["plan", "405B", "--nodes", "1", "--global-batch", "8"]) == 1  # nothing fits: said, exit 1
    assert "no plan of llama3-405b fits" in capsys.readouterr().out


def test_widget_figure_draws_the_search(search70):
    import matplotlib

    matplotlib.use("Agg")
    from simlib import widgets

    fig, caption = widgets.planner_figure(result=search70, top=5)
    assert planner.label(search70.best["strategy"]) in caption
    bars = fig.axes[0].patches
    assert len(bars) == 5 * 8  # five plans, eight terms each
    total = sum(b.get_width() for b in bars[-8:])  # the top bar (drawn last) is the best plan
    assert total == pytest.approx(search70.best["step_time"], rel=1e-9)


SMALL = dict(max_micro_batch=1, schedule=("1f1b",), tp_overlap=(False,), cp_kind=("ring",), fsdp=(False,))
FLAGS = {  # flag -> (model, its search, what every ranked plan must then show)
    "--tp 2": ("8B", lambda s: s.tp == 2),
    "--max-pp 2": ("8B", lambda s: s.pp <= 2),
    "--cp 2": ("8B", lambda s: s.cp == 2),
    "--dp 4": ("8B", lambda s: s.dp == 4),
    "--zero 1": ("8B", lambda s: s.zero_stage == 1),
    "--no-recompute": ("8B", lambda s: s.recompute == "none"),
    "--ep 4": ("qwen3-30b-a3b", lambda s: s.ep == 4),
}


@pytest.fixture(scope="module")
def unnarrowed():
    """One search per model on one node: what each narrowing flag is compared with."""
    return {
        m: sim.plan(m, "h100", nodes=1, global_batch=16, seq_len=4096, space=SMALL)
        for m in {m for m, _ in FLAGS.values()}
    }


@pytest.mark.parametrize("flag", FLAGS)
def test_each_narrowing_flag_narrows(flag, unnarrowed):
    """simlib plan's --tp/--max-pp/--cp/--dp/--ep/--zero/--no-recompute: the search keeps exactly the plans of
    the full search that meet the flag (same plans, same times), and some plans did not."""
    from simlib import cli
    from simlib import cli_plan as planner_cli

    model, ok = FLAGS[flag]
    args = cli.build_parser().parse_args(["plan", model, *flag.split()])
    space = planner_cli.narrowed(args)
    assert space, flag
    r = sim.plan(model, "h100", nodes=1, global_batch=16, seq_len=4096, space={**SMALL, **space})
    full = unnarrowed[model]
    want = [(e["strategy"], e["step_time"]) for e in full.ranked if ok(e["strategy"])]
    assert r.ranked and [(e["strategy"], e["step_time"]) for e in r.ranked] == want
    assert len(want) < len(full.ranked)  # the flag removed something


def test_cli_fastest_ranks_the_first_k_of_the_full_search(tmp_path, capsys, unnarrowed):
    """simlib plan --fastest K: the bounded search (plan(top=K)); plans.csv holds the full search's first K."""
    import pandas as pd

    from simlib import cli

    args = cli.build_parser().parse_args(["plan", "8B", "--fastest", "3"])
    assert args.fastest == 3
    full = unnarrowed["8B"]
    r = sim.plan("8B", "h100", nodes=1, global_batch=16, seq_len=4096, space=SMALL, top=args.fastest)
    assert [(e["strategy"], e["step_time"]) for e in r.ranked] == [
        (e["strategy"], e["step_time"]) for e in full.ranked[:3]
    ]
    rc = cli.main(
        [
            "plan",
            "8B",
            "--nodes",
            "1",
            "--global-batch",
            "16",
            "--max-pp",
            "2",
            "--zero",
            "1",
            "--fastest",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0 and "best plans" in capsys.readouterr().out
    assert len(pd.read_csv(tmp_path / "plans.csv")) == 2


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--fastest", "0"], "--fastest must be an int >= 1"),
        (["--tp", "3"], "needs 6 ranks but the world has 8"),  # Plan.validate: the degrees multiply to the world
        (["--tp", "0"], "Plan.tp must be an int >= 1, got 0"),
        (["--zero", "5"], "Plan.zero_stage must be 0, 1, 2 or 3, got 5"),
        (["--max-pp", "-1"], "Plan.pp must be an int >= 1, got -1"),
        (["--tp", "8", "--cp", "2"], "needs 16 ranks but the world has 8"),
    ],
)
def test_a_bad_narrowing_is_one_clear_line(argv, says, capsys):
    from simlib import cli

    assert cli.main(["plan", "8B", "--nodes", "1", "--global-batch", "16", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and err.startswith("simlib plan: "), err
