"""tessera.load: logits against a numpy GPT-2, generation against `tessera sample`, weights."""

import gc
import json
import random
import struct
import subprocess

import numpy as np
import pytest

import tessera


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_command):
    """A tiny GPT-2 trained on text for 3 steps by the command, with its BPE tokenizer."""
    d = tmp_path_factory.mktemp("model")
    rng = random.Random(1)
    words = "the quick brown fox jumps over a lazy dog while birds sing in tall trees".split()
    (d / "text.txt").write_text(
        "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)))
    run_command("train", "--data", d / "text.txt", "--vocab", 300, "--layers", 2, "--dim", 64,
                "--heads", 2, "--seq", 32, "--batch", 4, "--steps", 3, "--eval-every", 0,
                "--sample-tokens", 0, "--threads", 1, "--cache-dir", d / "cache", "--save",
                d / "run")
    return d / "run"


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        assert t["dtype"] == "F32"
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(t["shape"])
    return out


def gpt2_logits(w, tokens, heads, eps=1e-5):
    """GPT-2's forward in numpy (float64): learned positions, pre-LayerNorm blocks, tanh GELU,
    the head tied to the token embedding."""
    w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in w.items()}
    T = len(tokens)
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]

    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    layers = len({k.split(".")[1] for k in w if k.startswith("h.")})
    C = x.shape[1]
    hs = C // heads
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(layers):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=1)
        y = np.zeros_like(q)
        for h in range(heads):
            s = slice(h * hs, (h + 1) * hs)
            a = q[:, s] @ k[:, s].T / np.sqrt(hs) + mask
            a = np.exp(a - a.max(-1, keepdims=True))
            y[:, s] = (a / a.sum(-1, keepdims=True)) @ v[:, s]
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h1 = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h1 @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def test_weights_are_the_files_without_copies(trained):
    m = tessera.load(trained)
    w = m.weights()
    stored = read_safetensors(trained / "model.safetensors")
    assert {k.removeprefix("transformer.") for k in stored} <= set(w)
    for name, a in stored.items():
        np.testing.assert_array_equal(w[name.removeprefix("transformer.")], a)
    v = w["wte.weight"]
    assert v.dtype == np.float32 and not v.flags.writeable and not v.flags.owndata
    assert np.shares_memory(v, m.weights()["wte.weight"])  # the model's own memory
    del m, w
    gc.collect()
    assert v.sum() == pytest.approx(stored["wte.weight"].sum())  # the view keeps it alive


def test_forward_equals_a_numpy_gpt2(trained):
    m = tessera.load(trained, max_batch=2)
    assert m.vocab_size == 300 and m.block_size == 32
    tokens = np.random.default_rng(3).integers(0, 300, (2, 32))
    logits = m.forward(tokens)
    assert logits.shape == (2, 32, 300) and logits.dtype == np.float32
    w = read_safetensors(trained / "model.safetensors")
    for b in range(2):
        np.testing.assert_allclose(logits[b], gpt2_logits(w, tokens[b], heads=2), atol=2e-4,
                                   rtol=1e-4)
    # One sequence: [T, V]. Not bitwise the batch's row: BLAS may block a product of 32 rows
    # differently from one of 64 (OpenBLAS on AMD does), which changes the summation order.
    np.testing.assert_allclose(m.forward(tokens[1]), logits[1], atol=1e-6, rtol=1e-5)


def test_generate_equals_tessera_sample(trained, tessera_bin):
    m = tessera.load(trained)
    p = subprocess.run([tessera_bin, "sample", "--weights", str(trained), "--prompt",
                        "the quick", "--tokens", "20", "--seed", "3"], capture_output=True,
                       check=True)
    text = m.generate("the quick", 20, seed=3)  # a tiny model's bytes need not be UTF-8
    assert p.stdout.decode("utf-8", "replace") == "the quick" + text + "\n"
    ids = m.generate(m.encode("the quick"), 20, seed=3)
    assert m.decode(ids) == text and len(ids) == 20


def test_errors(trained, tmp_path):
    m = tessera.load(trained, max_batch=1)
    with pytest.raises(tessera.ShapeError, match="max_batch=2"):
        m.forward(np.zeros((2, 4), np.int64))
    with pytest.raises(tessera.ShapeError, match="context is 32"):
        m.forward(np.zeros((1, 33), np.int64))
    with pytest.raises(tessera.ShapeError, match="token id 300"):
        m.forward(np.array([[1, 300]]))
    with pytest.raises((tessera.ConfigError, tessera.IoError)):
        tessera.load(tmp_path / "nothing-here")
