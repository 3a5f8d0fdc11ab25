"""tessera.schedule against `tessera schedule`."""

import re

import pytest

import tessera


@pytest.mark.parametrize("kind,pp,m,v,costs", [
    ("1f1b", 4, 8, 1, "1,2,1"),
    ("zb-h1", 4, 8, 1, "1,2,1"),
    ("interleaved", 2, 4, 2, "1,2,1"),
    ("gpipe", 3, 5, 1, "1,2,1/2,3,1/1,1,0.5"),
])
def test_schedule_equals_the_command(run_command, tmp_path, kind, pp, m, v, costs):
    svg = tmp_path / "t.svg"
    out = run_command("schedule", "--schedule", kind, "--pp", pp, "--micro-batches", m,
                      "--virtual-stages", v, "--costs", costs, "--p2p-cost", 0.25, "--svg",
                      svg).stdout
    s = tessera.schedule(kind, pp, m, virtual_stages=v, costs=costs, p2p=0.25)
    assert s.ok
    for r, actions in enumerate(s.ranks):
        line = " ".join(f"[{a}]" if a.startswith(("send", "recv")) else a for a in actions)
        assert f"rank {r}: {line}\n" in out
    step = re.search(r"step time: (\S+)", out).group(1)
    assert float(step) == pytest.approx(s.step_time, rel=1e-6)
    bubble = re.search(r"bubble: (\S+)% of the step idle", out).group(1)
    assert f"{100 * s.bubble:.2f}" == bubble
    assert s.svg == svg.read_text()


def test_the_closed_form_bubble_and_costs_as_numbers():
    s = tessera.schedule("1f1b", 4, 12, costs=(1.0, 2.0, 1.0))
    assert s.bubble_formula == pytest.approx(3 / 15)
    assert s.bubble == pytest.approx(s.bubble_formula)
    per_rank = tessera.schedule("1f1b", 2, 4, costs=[(1, 2, 1), (2, 4, 2)])
    assert per_rank.bubble_formula is None and per_rank.step_time > 0
    assert s._repr_svg_().startswith("<svg") or "<svg" in s._repr_svg_()[:200]


def test_bad_schedules_raise_config_error():
    with pytest.raises(tessera.ConfigError, match="schedule"):
        tessera.schedule("2f2b", 4, 8)
    with pytest.raises(tessera.ConfigError, match="cost triples"):
        tessera.schedule("1f1b", 4, 8, costs="1,2,1/1,2,1")
