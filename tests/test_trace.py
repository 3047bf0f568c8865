"""Standard traces (simlib.debug.trace): torch.profiler on every rank, merged into one Chrome trace."""
import json


def _profiled_gpt(out_dir):
    import torch.distributed as dist

    from simlib.projects.gpt import run as project_gpt
    from simlib.debug import trace
    from simlib.train import train
    cfg = {**project_gpt.settings(quick=True), "steps": 4, "eval_every": 0, "log_every": 10, "verbose": False,
           "measure_memory": False, "warmup": 1}
    task = cfg.pop("task")
    with trace.profile(out_dir) as prof:
        record = train(task, project_gpt.plan_for("dp", dist.get_world_size()), **cfg)
    return str(prof.path) if prof.path else None, record.summary["exposed_comm_time"]


def test_merged_trace_has_a_row_per_rank_and_a_communication_track(cluster2, tmp_path):
    from simlib.debug import trace
    (path, record_exposed), (other, _) = cluster2.run(_profiled_gpt, str(tmp_path))
    assert other is None and path == str(tmp_path / "trace.json")  # rank 0 merges
    data = json.loads((tmp_path / "trace.json").read_text())  # valid JSON, Chrome's trace format
    assert isinstance(data["traceEvents"], list) and all("ph" in e for e in data["traceEvents"])
    shape = trace.check(path)
    assert shape["processes"] == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        names = [name for (pid, _), name in shape["threads"].items() if pid == rank]
        assert "compute (main thread)" in names and "simlib steps" in names and "simlib spans" in names
        assert any(n.startswith("communication") for n in names), names
        assert shape["comm_slices"][rank] > 0
    ops = {e["name"] for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "communication"}
    assert "gloo:all_reduce" in ops, ops
    spans = {e["args"]["kind"] for e in data["traceEvents"] if e.get("cat") == "simlib"}
    assert {"step", "forward", "backward", "optimizer"} <= spans
    exposed = trace.exposed_comm(path)
    assert set(exposed["median_per_rank"]) == {0, 1} and len(exposed["per_rank"][0]) == 3  # 4 steps, 1 warm-up
    assert 0 < exposed["exposed_comm_time"] <= exposed["comm_time"] + 1e-9
    assert record_exposed is not None and record_exposed > 0
