"""tessera.train against `tessera train`: the same config and data give the same run, bitwise."""

import json
import signal
from pathlib import Path

import numpy as np
import pytest

import tessera

VOCAB = 300


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(7).integers(0, VOCAB, 30000, dtype=np.int64)


@pytest.fixture
def config(tmp_path, tokens):
    data = tessera.write_tokens(tmp_path / "train.tok", tokens, VOCAB)
    return {
        "data": str(data), "vocab": VOCAB, "layers": 2, "dim": 64, "heads": 2, "seq": 32,
        "batch": 4, "steps": 6, "warmup": 2, "eval_every": 3, "eval_batches": 2,
        "val_fraction": 0.1, "sample_tokens": 0, "threads": 1, "peak_gflops": 100,
        "cache_dir": str(tmp_path / "cache"), "save_async": False,
    }


def metrics(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def losses(path):
    return [m["loss"] for m in metrics(path) if "loss" in m]


def weights(save_dir):
    return (Path(save_dir) / "model.safetensors").read_bytes()


def test_train_equals_the_command_bitwise(config, tmp_path, run_command, tokens):
    cmd = dict(config, save=str(tmp_path / "cmd"), metrics=str(tmp_path / "cmd.jsonl"))
    (tmp_path / "cmd.json").write_text(json.dumps(cmd))
    run_command("train", "--config", tmp_path / "cmd.json")

    # The same config from Python, its data from an iterator of numpy chunks.
    py = dict(config, save=str(tmp_path / "py"), metrics=str(tmp_path / "py.jsonl"))
    del py["data"]
    seen = []
    r = tessera.train(py, data=iter(np.array_split(tokens, 7)), callback=seen.append,
                      progress=False)
    assert r.steps == 6 and r.stopped_by is None
    assert losses(tmp_path / "py.jsonl") == losses(tmp_path / "cmd.jsonl")
    assert r.losses == losses(tmp_path / "cmd.jsonl")
    assert [m["loss"] for m in seen] == r.losses and [m["step"] for m in seen] == list(range(1, 7))
    vals = [m["val_loss"] for m in metrics(tmp_path / "cmd.jsonl") if "val_loss" in m]
    assert r.last_val_loss == vals[-1]
    assert weights(tmp_path / "py") == weights(tmp_path / "cmd")


def test_the_callback_stops_a_run_whose_checkpoint_resumes(config, tmp_path):
    whole = tessera.train(config, save=str(tmp_path / "whole"), progress=False)

    # False from step 3 on: the ranks agree on the stop after step 3's metrics (and hook).
    r = tessera.train(config, save=str(tmp_path / "part"), progress=False,
                      callback=lambda m: m["step"] < 3)
    assert r.stopped_by == "callback" and r.steps == 3
    assert Path(r.checkpoint).name == f"step-{r.steps:08d}"
    assert r.losses == whole.losses[:r.steps]

    resumed = tessera.train(resume=str(tmp_path / "part"), progress=False)
    assert resumed.first_step == r.steps and resumed.steps == 6
    assert resumed.losses == whole.losses[r.steps:]
    assert weights(tmp_path / "part") == weights(tmp_path / "whole")


def test_a_callback_exception_stops_the_run_and_is_raised(config, tmp_path):
    def cb(m):
        if m["step"] == 2:
            raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        tessera.train(config, save=str(tmp_path / "s"), callback=cb, progress=False)
    assert list((tmp_path / "s").glob("step-*/model.safetensors"))  # it stopped and saved


def test_sigint_stops_after_the_step_and_saves(config, tmp_path):
    def cb(m):
        if m["step"] == 2:
            # As Ctrl-C or a notebook's interrupt, delivered to this (rank 0's) thread before
            # raise_signal returns, so that the stop lands at a known step.
            signal.raise_signal(signal.SIGINT)
    # Python's own handler, as in a terminal or a notebook: under a shell's background job SIGINT
    # starts ignored, and tessera leaves an ignored SIGINT ignored (as the command does).
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        r = tessera.train(config, save=str(tmp_path / "s"), callback=cb, progress=False)
        assert r.stopped_by == "SIGINT" and r.steps == 2  # as the callback's stop above
        assert Path(r.checkpoint).name == f"step-{r.steps:08d}"
        assert signal.getsignal(signal.SIGINT) is before  # Python's handler is back
    finally:
        signal.signal(signal.SIGINT, started_with)


def test_progress_without_a_terminal_prints_lines(config, capsys):
    tessera.train(config, log_every=2, eval_every=0)
    out = capsys.readouterr().out
    assert "\r" not in out
    shown = [line.split("|")[0].split()[1] for line in out.splitlines()
             if line.startswith("step ") and "| loss" in line]
    assert {"2/6", "4/6", "6/6"} <= set(shown) and not {"3/6", "5/6"} & set(shown)


def test_configuration_errors_carry_the_trainers_message(config):
    with pytest.raises(tessera.ConfigError, match="micro_batch"):
        tessera.train(config, micro_batch=3, progress=False)
    with pytest.raises(tessera.ConfigError, match="no_such_key"):
        tessera.train(config, no_such_key=1, progress=False)
    with pytest.raises(tessera.ConfigError, match="ids? .*300|300"):
        tessera.train(config, data=[np.array([1, 2, 999])], progress=False)
    assert "grad_clip" in tessera.config_keys()


def test_text_data_and_a_sample_that_is_not_utf8(tmp_path, capsys):
    # A tiny model's byte-level sample need not be UTF-8: it arrives with replacements, in the
    # result and in the progress output, and nothing hangs on the way.
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(1)
    words = "the quick brown fox jumps over a lazy dog while birds sing in tall trees".split()
    text.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(2000)))
    r = tessera.train(data=text, vocab=300, layers=2, dim=64, heads=2, seq=32, batch=4, steps=2,
                      eval_every=0, threads=1, cache_dir=str(tmp_path / "cache"),
                      sample_tokens=40, seed=5)
    assert isinstance(r.sample, str) and len(r.sample) > 0
    assert "sample:" in capsys.readouterr().out


def test_the_gil_is_released_while_training(config):
    # A Python thread keeps running while the trainer works: the GIL is not held by train().
    import threading
    import time

    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        start = time.perf_counter()
        tessera.train(config, steps=20, eval_every=0, progress=False)
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        t.join()
    assert ticks[0] > 0.05 * elapsed / 0.001  # held throughout, it would tick once or twice
