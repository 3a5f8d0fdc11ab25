"""tessera.plan and tessera.rank_layouts against `tessera plan --json`."""

import json

import pytest

import tessera
from conftest import normalise

GPT3 = {"layers": 96, "hidden": 12288, "heads": 96, "seq": 2048, "vocab": 50257}


def command_json(run_command, tmp_path, *args):
    out = tmp_path / "plan.json"
    run_command("plan", *args, "--json", out, check=False)
    return json.loads(out.read_text())


def test_clusters_are_the_shipped_ones():
    assert {"dev-vm", "dgx-a100-80gb", "dgx-h100"} <= set(tessera.clusters())


def test_gpt3_on_dgx_a100_equals_the_command(run_command, tmp_path):
    model = tmp_path / "gpt3.json"
    model.write_text(json.dumps(GPT3))
    layout = {"dp": 8, "tp": 8, "pp": 16, "micro_batch": 1, "schedule": "1f1b"}
    p = tessera.plan(model, "dgx-a100-80gb", layout, batch=1536, devices=1024)
    want = command_json(run_command, tmp_path, "--model", model, "--cluster", "dgx-a100-80gb",
                        "--dp", 8, "--tp", 8, "--pp", 16, "--micro-batch", 1, "--schedule",
                        "1f1b", "--batch", 1536, "--devices", 1024)
    assert normalise(p.to_json()) == want
    assert p.ok and p.fits
    assert 0 < p.mfu < 1 and p.step_seconds > 0 and p.tokens_per_second > 0
    # Memory by term, the largest rank's.
    assert {"parameters", "gradients", "activations"} <= set(p.memory)


def test_default_model_layout_equals_the_command(run_command, tmp_path):
    p = tessera.plan(layout={"dp": 2, "zero": 1})
    want = command_json(run_command, tmp_path, "--dp", 2, "--zero", 1)
    assert normalise(p.to_json()) == want
    assert "dp=2" in str(p)


def test_ranking_equals_the_command(run_command, tmp_path):
    k = tessera.rank_layouts(cluster="dev-vm", fixed={"zero": 0}, top=5)
    want = command_json(run_command, tmp_path, "--zero", 0, "--top", 5)
    assert normalise(k.to_json()) == want
    assert k.best is not None and k.fitting[0] == k.best


def test_a_layout_that_cannot_run_says_why():
    p = tessera.plan(layout={"tp": 3})  # 4 heads
    assert not p.ok
    assert any("tp" in s for s in p.prediction["problems"])


def test_bad_input_raises_config_error_with_the_library_message():
    with pytest.raises(tessera.ConfigError, match="unknown layout key 'bogus'"):
        tessera.plan(layout={"bogus": 1})
    with pytest.raises(tessera.ConfigError) as e:
        tessera.plan({"layers": 4, "hidden": 190, "heads": 4})
    assert isinstance(e.value, tessera.Error) and isinstance(e.value, RuntimeError)
    with pytest.raises(tessera.ConfigError, match="no-such-cluster.json' is neither a file"):
        tessera.plan(cluster="/no/such/dir/no-such-cluster.json")


def test_a_training_config_equals_the_command(run_command, tmp_path):
    cfg = {"layers": 6, "dim": 256, "heads": 8, "seq": 256, "batch": 32, "dp": 2, "tp": 2,
           "zero": 1, "micro_batch": 4, "optimizer": "sgd", "bucket_mb": 8}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    p = tessera.plan(config=path, cluster="dgx-h100")
    want = command_json(run_command, tmp_path, "--config", path, "--cluster", "dgx-h100")
    assert normalise(p.to_json()) == want
    assert p.prediction["layout"]["tp"] == 2 and p.request["global_batch"] == 32
    # Arguments given win over the config, as flags do.
    q = tessera.plan(config=cfg, layout={"tp": 1}, batch=64, cluster="dgx-h100")
    want = command_json(run_command, tmp_path, "--config", path, "--tp", 1, "--batch", 64,
                        "--cluster", "dgx-h100")
    assert normalise(q.to_json()) == want
