"""The torch reference beside the course's MFU: the same GPT at its GPU size, trained by a plain loop
(``torch.compile`` of each block, fused AdamW, bf16 autocast, SDPA's flash attention; no timeline, no hooks),
its MFU by the course's own code (``simlib.debug.mfu``) against the datasheet's dense peak.

    python benchmarks/gpu_reference.py --json out.json               # on the GPU, the GPT's GPU size
    python benchmarks/gpu_reference.py --device cpu --tiny --json x   # the same code on a CPU at a tiny size

The GPU check runs it after ``simlib train gpt --size gpu`` and puts both MFUs side by side in gpu_check.json;
``simlib.lessons.one_device.plain_loop`` is the loop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TINY = dict(seq_len=32, hidden=64, num_layers=2, num_heads=4)


def reference(device: str = "cuda", seconds: float = 20.0, tiny: bool = False, compile="blocks") -> dict:
    """The reference run: the GPU size's model (``simlib.projects.gpu.GPT_SHAPE``) on the shipped corpus's
    vocabulary, one micro-batch of the size the GPU size uses on this GPU, trained for ``seconds``."""
    from simlib.lessons.one_device import plain_loop
    from simlib.projects import gpu
    from simlib.projects.gpt.model import GPTConfig
    from simlib.projects.gpt.task import GPTTask

    shape = TINY if tiny else gpu.GPT_SHAPE
    task = GPTTask(**shape, global_batch=4, eval_windows=1)  # the vocabulary the course's run uses (shipped)
    config = GPTConfig(
        task.config.vocab_size, shape["seq_len"], shape["hidden"], shape["num_layers"], shape["num_heads"]
    )
    facts = gpu.gpu_facts() if device == "cuda" else []
    micro = 2 if tiny else gpu.micro_batch_for(facts)
    t0 = time.monotonic()
    out = plain_loop(config, micro, device, seconds=seconds, compile=compile)
    from simlib.debug.mfu import flops_per_token

    out.update(
        shape=shape,
        vocab_size=config.vocab_size,
        flops_per_token=flops_per_token(config)["total"],
        seconds=round(time.monotonic() - t0, 1),
        what="plain loop: torch.compile of each block, fused AdamW, bf16 autocast, SDPA",
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--tiny", action="store_true", help="a tiny model (tests on a CPU)")
    parser.add_argument("--no-compile", action="store_true", help="eager (tests where compiling is too slow)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    try:
        record = {
            "status": "passed",
            **reference(args.device, args.seconds, args.tiny, False if args.no_compile else "blocks"),
        }
    except Exception as exc:  # noqa: BLE001 - recorded: the check reads the file
        record = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
    Path(args.json).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps({k: record.get(k) for k in ("status", "step_s", "tokens_per_s", "mfu", "error")}))
    return 0 if record["status"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
