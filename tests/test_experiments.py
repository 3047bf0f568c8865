"""The main job: `simlib scaling` runs a real sweep and writes a plot, CSV and JSON."""

import json

import pandas as pd
import pytest

from simlib import cli
from simlib.lessons import scaling as experiments


def test_scaling_cli_quick(tmp_path, capsys):
    assert cli.main(["scaling", "--quick", "--world-sizes", "1", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "wrote" in out
    for name in ("scaling_strong.png", "scaling_strong_timeline.png", "scaling_strong.csv", "scaling_strong.json"):
        assert (tmp_path / name).stat().st_size > 0
    table = pd.read_csv(tmp_path / "scaling_strong.csv")
    runs = table[table["baseline"].isna()]
    assert runs["world_size"].tolist() == [1, 2]
    assert runs["speedup"].iloc[0] == pytest.approx(1.0)
    assert runs["comm_fraction"].iloc[0] == 0 and 0 < runs["comm_fraction"].iloc[1] < 1
    assert (table["step_time"] > 0).all() and (table["step_time_p25"] <= table["step_time_p75"]).all()
    # strong scaling: the same global batch at every world size
    assert runs["global_batch"].nunique() == 1 and runs["local_batch"].tolist() == [256, 128]
    baseline = table[table["baseline"].notna()]
    assert len(baseline) == 1 and baseline["threads"].iloc[0] >= 2
    # efficiency divides by the cores a setup uses: the 1-process x N-threads rival is judged on N cores
    b = baseline.iloc[0]
    assert b["efficiency"] == pytest.approx(b["speedup"] / b["threads"])
    assert runs["efficiency"].tolist() == pytest.approx((runs["speedup"] / runs["world_size"]).tolist())
    meta = json.loads((tmp_path / "scaling_strong.json").read_text())
    assert meta["config"]["mode"] == "strong" and len(meta["rows"]) == len(table)


def test_scaling_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        experiments.scaling((1, 2), mode="diagonal")
    with pytest.raises(ValueError, match="split evenly"):
        experiments.scaling((1, 3), global_batch=256)
    assert cli.main(["scaling", "--world-sizes", "0", "--quick"]) == 2


def test_weak_scaling_keeps_the_per_rank_batch():
    table = experiments.scaling(
        (1, 2),
        mode="weak",
        width=64,
        depth=1,
        global_batch=64,
        steps=3,
        warmup=1,
        all_cores_baseline=False,
        progress=False,
    )
    assert table["local_batch"].tolist() == [32, 32] and table["global_batch"].tolist() == [32, 64]
    assert table["speedup"].iloc[0] == pytest.approx(1.0)
    # scaled speedup is throughput(N) / throughput(1)
    assert table["speedup"].iloc[1] == pytest.approx(table["throughput"].iloc[1] / table["throughput"].iloc[0])
