"""Shared fixtures: the `tessera` command the Python results are compared with."""

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _command():
    env = os.environ.get("TESSERA_BIN")
    if env:
        return env
    built = REPO / "build" / "apps" / "tessera" / "tessera"
    if built.is_file():
        return str(built)
    return shutil.which("tessera")


@pytest.fixture(scope="session")
def tessera_bin():
    """The `tessera` command: $TESSERA_BIN, build/apps/tessera/tessera, or PATH's. scripts/test.sh
    sets TESSERA_BIN; elsewhere a test that needs the command is skipped (and says so)."""
    path = _command()
    if not path:
        if os.environ.get("TESSERA_REQUIRE_COMMAND") == "1":
            pytest.fail("TESSERA_REQUIRE_COMMAND=1 but no tessera command was found")
        pytest.skip("no `tessera` command found (set TESSERA_BIN)")
    return path


@pytest.fixture(scope="session")
def run_command(tessera_bin):
    def run(*args, check=True, cwd=None, timeout=600):
        p = subprocess.run([tessera_bin, *map(str, args)], capture_output=True, text=True,
                           cwd=cwd, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"tessera {' '.join(map(str, args))} exited {p.returncode}:\n"
                                 f"{p.stdout}\n{p.stderr}")
        return p
    return run


def normalise(x):
    """JSON as the command writes it: NaN and infinities become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: normalise(v) for k, v in x.items()}
    if isinstance(x, list):
        return [normalise(v) for v in x]
    return x
