# %% [markdown]
# # Plan GPT-3 on DGX A100, then train the default model with a live loss plot
#
# A notebook as a script: each `# %%` is a cell (VS Code and Jupyter's jupytext open it as one).
# Run it whole with `python python/examples/plan_and_train.py`; TESSERA_EXAMPLE_STEPS sets the
# training steps (default 200).

# %%
import os
import sys

import tessera

GPT3 = {"layers": 96, "hidden": 12288, "heads": 96, "seq": 2048, "vocab": 50257}

# Every layout of 1024 A100s for GPT-3's batch of 1536 sequences, fastest first.
ranking = tessera.rank_layouts(GPT3, "dgx-a100-80gb", devices=1024, batch=1536, top=5)
print(ranking)

# %%
# The fastest layout that fits, planned alone: memory per GPU by term, step time, MFU.
assert ranking.best is not None, "no layout fits"
best = ranking.best["layout"]
p = tessera.plan(GPT3, "dgx-a100-80gb", best, batch=1536, devices=1024)
gib = 1024 ** 3
for term, nbytes in sorted(p.memory.items(), key=lambda kv: -kv[1]):
    print(f"{term:>16}: {nbytes / gib:7.2f} GiB")
print(f"step {p.step_seconds:.2f} s, {p.tokens_per_second:,.0f} tokens/s, MFU {100 * p.mfu:.1f}%")

# %%
# Train the default model (a small GPT-2 on Debian's fortunes corpus) in this process, plotting
# the loss as it goes. In Jupyter the figure redraws in place; elsewhere it is saved at the end.
steps = int(os.environ.get("TESSERA_EXAMPLE_STEPS", "200"))
try:
    import matplotlib

    if "ipykernel" not in sys.modules and not os.environ.get("DISPLAY"):
        matplotlib.use("Agg")  # no screen: draw to a file
    import matplotlib.pyplot as plt
except ImportError:  # pip install matplotlib for the plot
    plt = None

losses: list[float] = []


def on_step(m):
    losses.append(m["loss"])
    if plt is not None and (m["step"] % 10 == 0 or m["step"] == steps):
        plt.clf()
        plt.plot(range(1, len(losses) + 1), losses)
        plt.xlabel("step")
        plt.ylabel("training loss")
        plt.pause(0.001)  # redraws an interactive figure; a no-op on Agg


result = tessera.train(steps=steps, save="runs/python-example", callback=on_step)
print(result)
if plt is not None:
    plt.savefig("runs/python-example/loss.png")
    print("loss curve: runs/python-example/loss.png")

# %%
# The trained model: generate from it, look at its weights.
model = tessera.load("runs/python-example")
print(model.generate("Q: ", 80, seed=1))
print({name: w.shape for name, w in list(model.weights().items())[:4]})
