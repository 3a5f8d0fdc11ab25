"""The examples run (a few steps each)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", ["spawn_collectives.py", "iterator_data.py"])
def test_example_runs(name, tmp_path):
    env = dict(os.environ, TESSERA_EXAMPLE_STEPS="4", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
