"""Per-step overhead of tessera.train's Python callback and of numpy data feeding, against the
`tessera train` command, on the default model (4 layers of 192, batch 16 x 128 tokens, the
default corpus).

    python python/bench/callback_overhead.py --tessera build/apps/tessera/tessera

What it measures:
  1. the step time: the median `step_ms` of the command's metrics, and of tessera.train's run with
     a callback and its data fed from a Python iterator of numpy arrays;
  2. the callback's own cost per step: the trainer's hook around a Python callback (the GIL taken
     on rank 0's thread, the metrics record converted to a dict, the call) timed over many calls
     with a real record, from a thread without the GIL, as rank 0 calls it;
  3. numpy data feeding: the iterator is drained into a token file before the first step (timed),
     which the trainer memory-maps like any other, so its per-step cost is nil;
  4. a sanity check end to end: wall time per step of `--steps` and `2 x --steps` runs (the
     difference over --steps, set-up cancelled), command against Python, median of --repeats.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tessera
from tessera import _tessera


def median_step_ms(metrics_path):
    rows = [json.loads(x) for x in Path(metrics_path).read_text().splitlines()]
    return statistics.median(r["step_ms"] for r in rows if "step_ms" in r and r["step"] > 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default="build/apps/tessera/tessera")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="BLAS threads (0: all cores)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    base = {"eval_every": 0, "val_fraction": 0.05, "sample_tokens": 0, "threads": args.threads,
            "peak_gflops": 100, "cache_dir": str(work / "cache"), "warmup": 5}

    # The default corpus, prepared once (its tokenizer and token file in the cache).
    subprocess.run([args.tessera, "train", "--steps", "1", "--cache-dir", base["cache_dir"],
                    "--eval-every", "0", "--sample-tokens", "0"], check=True,
                   capture_output=True)
    tok = next((work / "cache").rglob("tokens.tsrtok"))
    ids = np.fromfile(tok, dtype=np.uint16, offset=64)  # tessera token file: a 64-byte header
    chunks = np.array_split(ids.astype(np.int64), 64)
    t0 = time.perf_counter()
    tessera.write_tokens(work / "fed.tok", iter(chunks), 512)
    drain_s = time.perf_counter() - t0

    def command(steps, metrics=None):
        cfg = dict(base, steps=steps, data=str(tok), metrics=str(metrics or ""))
        (work / "c.json").write_text(json.dumps(cfg))
        t = time.perf_counter()
        subprocess.run([args.tessera, "train", "--config", str(work / "c.json")], check=True,
                       capture_output=True)
        return time.perf_counter() - t

    records = []

    def python(steps, metrics=None):
        cfg = dict(base, steps=steps, metrics=str(metrics or ""))
        t = time.perf_counter()
        tessera.train(cfg, data=iter(chunks), callback=records.append, progress=False)
        return time.perf_counter() - t

    wall = {"command": [], "python": []}
    for _ in range(args.repeats):
        for name, run in (("command", command), ("python", python)):
            short, long = run(args.steps), run(2 * args.steps)
            wall[name].append((long - short) / args.steps)
    for p in (work / "c.jsonl", work / "p.jsonl"):
        p.unlink(missing_ok=True)
    command(2 * args.steps, work / "c.jsonl")
    python(2 * args.steps, work / "p.jsonl")
    cmd_ms, py_ms = median_step_ms(work / "c.jsonl"), median_step_ms(work / "p.jsonl")

    record = records[-1]
    hook_s = _tessera._time_step_hook(lambda m: records.append(m), record, 20000)
    del records[-20000:]

    print(f"tessera {tessera.__version__}; default model; threads {args.threads or 'all'}; "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"step time, median step_ms: command {cmd_ms:.2f} ms, tessera.train {py_ms:.2f} ms "
          f"({100 * (py_ms - cmd_ms) / cmd_ms:+.2f}%)")
    print(f"callback per step: {1e6 * hook_s:.2f} us = {100 * hook_s / (cmd_ms / 1e3):.4f}% of "
          f"the command's step (record of {len(record)} keys, callback list.append)")
    print(f"numpy data feeding: {len(ids)} tokens from 64 arrays drained into a token file in "
          f"{1e3 * drain_s:.1f} ms, once before the first step; nothing per step")
    c, p = statistics.median(wall["command"]), statistics.median(wall["python"])
    print(f"end to end, wall per step ({args.steps} vs {2 * args.steps} steps, median of "
          f"{args.repeats}): command {1e3 * c:.1f} ms, tessera.train with callback and iterator "
          f"{1e3 * p:.1f} ms ({100 * (p - c) / c:+.1f}%; runs: command "
          f"{', '.join(f'{1e3 * x:.0f}' for x in wall['command'])}; python "
          f"{', '.join(f'{1e3 * x:.0f}' for x in wall['python'])})")


if __name__ == "__main__":
    sys.exit(main())
