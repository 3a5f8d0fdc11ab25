"""PyTorch's side of bench/attention/run.sh: causal scaled_dot_product_attention forward +
backward on one CPU thread, fp32, q, k, v of [1, heads, T, head size] (B = 1), one warm-up then
`repeats` timed. Prints one JSON line like bench_attention's: the seconds of each repeat, their
median (wall clock and the process's CPU time) and the growth of the process's peak resident memory (VmHWM) over the inputs and outputs.

Usage: torch_sdpa.py T [heads (12)] [head size (64)] [repeats (3)]
"""
import json
import statistics
import sys
import time

import torch


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    T = int(sys.argv[1])
    heads = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    hs = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    torch.set_num_threads(1)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, T, hs, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, heads, T, hs)
    # Outputs and gradients touched before the baseline, as bench_attention's.
    for x in (q, k, v):
        x.grad = torch.zeros_like(x)
    out = torch.zeros(1, heads, T, hs)
    base = peak_rss()
    seconds, cpu = [], []
    for r in range(repeats + 1):
        for x in (q, k, v):
            x.grad = None
        t0, c0 = time.perf_counter(), time.process_time()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)
        if r > 0:
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    print(json.dumps({"impl": "torch", "T": T, "heads": heads, "head_size": hs,
                      "seconds": [round(s, 4) for s in seconds],
                      "median_s": round(statistics.median(seconds), 4),
                      "median_cpu_s": round(statistics.median(cpu), 4),
                      "extra_mib": round((peak_rss() - base) / 2**20, 1),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
