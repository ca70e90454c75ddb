"""Shared fixtures of the Python tests: where the built kiln programs are, and a runner."""
import os
import subprocess
from pathlib import Path

import pytest

BUILD_DIR = Path(os.environ.get("KILN_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))


@pytest.fixture(scope="session")
def kiln_bin():
    """kiln_bin("kiln-smoke") -> path of a built program; skips nothing: a missing one fails."""

    def find(name: str) -> Path:
        for candidate in (BUILD_DIR / "bin" / name, BUILD_DIR / "tests" / name):
            if candidate.exists():
                return candidate
        raise FileNotFoundError(f"{name} not built under {BUILD_DIR}")

    return find


@pytest.fixture(scope="session")
def run_kiln(kiln_bin):
    """run_kiln("kiln-smoke", "--steps", "5") -> CompletedProcess with text stdout/stderr."""

    def run(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(kiln_bin(name)), *map(str, args)], capture_output=True, text=True, timeout=timeout)

    return run
