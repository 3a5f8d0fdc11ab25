"""Train on tokens from a Python iterator, then generate from the model.

    python python/examples/iterator_data.py

The iterator here yields numpy arrays of a toy language (counting in base 10, as token ids);
any iterable of integer arrays works: a generator over a dataset, a tokenizer's output, lists.
tessera.train drains it into a token file in the cache directory (named by its content, so a
second run reuses it) and trains on that file as `tessera train --data` would.
"""

import os

import numpy as np

import tessera

VOCAB = 300  # ids must be below it
steps = int(os.environ.get("TESSERA_EXAMPLE_STEPS", "100"))


def documents(n=4000, seed=0):
    """Sequences of consecutive numbers written digit by digit (ids 0-9), 10 between numbers,
    11 at the end of a document."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        start = int(rng.integers(0, 10_000))
        digits = [d for k in range(start, start + 8) for d in [*map(int, str(k)), 10]]
        yield np.array(digits + [11], dtype=np.int32)


history: list[float] = []
result = tessera.train(
    data=documents(), vocab=VOCAB, layers=2, dim=64, heads=4, seq=64, batch=16, steps=steps,
    lr=3e-3, warmup=10, eval_every=max(1, steps // 4), sample_tokens=0,
    save="runs/python-iterator", callback=lambda m: history.append(m["loss"]), progress=False)
print(f"{result.steps} steps: loss {history[0]:.3f} -> {history[-1]:.3f}, "
      f"validation {result.last_val_loss:.3f}")

model = tessera.load("runs/python-iterator")
prompt = [1, 2, 3, 4, 10, 1, 2, 3, 5, 10]  # "1234 1235 "
print("continuation of 1234 1235:", model.generate(prompt, 12, temperature=0.1, seed=0))
logits = model.forward(np.array([prompt]))
print("most likely next id after the prompt:", int(logits[0, -1].argmax()))
