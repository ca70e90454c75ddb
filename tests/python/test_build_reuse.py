"""The quickstart's build (no CUDA kernels, no tests) and the test command's build (CUDA kernels and
tests) in the same folder share every object but those of the few sources that test
KILN_WITH_CUDA (lib/CMakeLists.txt, kiln_cuda_aware): their compile commands are compared after
configuring one folder both ways, in the order README.md's two commands do it."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_TEST = re.compile(r"^#\s*(if|ifdef|ifndef|elif).*KILN_WITH_CUDA", re.M)


def configure(build: Path, *args: str) -> dict:
    cmd = (f"source '{ROOT}/scripts/env.sh' && cmake -S '{ROOT}' -B '{build}' -G Ninja -DCMAKE_BUILD_TYPE=Release "
           f"-DCMAKE_EXPORT_COMPILE_COMMANDS=ON ${{Torch_DIR:+-DTorch_DIR=\"$Torch_DIR\"}} " + " ".join(args))
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    entries = json.loads((build / "compile_commands.json").read_text())
    # (source, object) -> command; the object named by -o (CMake 3.25 has no "output" key)
    return {(e["file"], re.search(r" -o (\S+)", e["command"]).group(1)): e["command"] for e in entries}


def torch_has_cuda(build: Path) -> bool:
    cache = (build / "CMakeCache.txt").read_text()
    return "KILN_CUDA:STRING=AUTO" in cache and (build / "lib" / "CMakeFiles" / "kiln_kernels.dir").exists()


def test_quickstart_objects_are_reused_by_the_test_build(tmp_path):
    build = tmp_path / "build"
    quick = configure(build, "-DKILN_CUDA=OFF", "-DKILN_BUILD_TESTS=OFF")
    full = configure(build, "-DKILN_CUDA=AUTO", "-DKILN_BUILD_TESTS=ON")
    if not torch_has_cuda(build):
        pytest.skip("this LibTorch has no CUDA: both builds are the same")

    lib_objects = {k for k in quick if "/kiln_objects.dir/" in k[1]}
    assert len(lib_objects) > 40, sorted(quick)[:5]
    changed, same = [], []
    for key in sorted(lib_objects | {k for k in quick if "/kiln-pretrain.dir/" in k[1] or "/kiln-generate.dir/" in k[1]}):
        source = Path(key[0]).read_text(errors="replace")
        expect_change = bool(CUDA_TEST.search(source))
        assert key in full, f"{key[0]}: compiled by the quickstart's build but not by the test build"
        differs = quick[key] != full[key]
        (changed if differs else same).append(os.path.relpath(key[0], ROOT))
        assert differs == expect_change, (
            f"{key[0]}: its compile command {'differs' if differs else 'is the same'} between the two builds, "
            f"but the source {'tests' if expect_change else 'does not test'} KILN_WITH_CUDA:\n"
            f"quickstart: {quick[key]}\ntest build: {full[key]}")
        if differs:  # the define and nothing else
            assert full[key].replace(" -DKILN_WITH_CUDA", "") == quick[key], (quick[key], full[key])
    assert len(changed) <= 12 and len(same) >= 50, (changed, len(same))
    # The CUDA build adds the kernels and the launchers; the quickstart's has none of them.
    assert not any(k[0].endswith(".cu") for k in quick)
    assert any(k[0].endswith("flash_attention.cu") for k in full)
    shutil.rmtree(build, ignore_errors=True)
