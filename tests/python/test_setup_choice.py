"""scripts/choose_torch.sh (run by scripts/setup.sh): which LibTorch build and which nvcc, from what
nvidia-smi says. References: nvidia-smi outputs recorded from a V100 on an R535 driver (CUDA 12.2),
an A100 on R550 (12.4) and an H100 on R580 (13.0) (tests/python/fixtures/nvidia-smi), and NVIDIA's
published limits: CUDA 13 dropped sm_70, and its builds need an R580 driver, while cu128 runs on R525+.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "python" / "fixtures" / "nvidia-smi"


def fake_tools(tmp_path, gpu=None, nvcc_majors=()):
    """A PATH with a recorded nvidia-smi (or none) and fake nvcc's of the given CUDA majors."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:
        text, csv = FIXTURES / f"{gpu}.txt", FIXTURES / f"{gpu}.csv"
        (bin_dir / "nvidia-smi").write_text(
            "#!/bin/sh\n"
            f'case "$1" in\n  -L) echo "GPU 0: recorded";;\n  --query-gpu=*) cat "{csv}";;\n  *) cat "{text}";;\nesac\n')
        (bin_dir / "nvidia-smi").chmod(0o755)
    nvccs = {}
    for major in nvcc_majors:
        d = tmp_path / f"cuda-{major}" / "bin"
        d.mkdir(parents=True)
        (d / "nvcc").write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {major}.4, V{major}.4.131'\n")
        (d / "nvcc").chmod(0o755)
        nvccs[major] = str(d / "nvcc")
    return bin_dir, nvccs


def choose(tmp_path, bin_dir, **env):
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "KILN_HOME": str(tmp_path / "kiln")}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "choose_torch.sh")], capture_output=True, text=True,
                       env={**base, **env})
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return r, out


@pytest.mark.parametrize("gpu, major, torch, reason", [
    ("v100-r535", "12", "2.10.0", "compute capability 7.0"),
    ("a100-r550", "12", "2.10.0", "CUDA 12.4"),
    ("h100-r580", "13", "2.11.0", "NVIDIA H100"),
    (None, "13", "2.11.0", "no GPU"),
])
def test_the_build_follows_the_gpus_and_the_driver(tmp_path, gpu, major, torch, reason):
    bin_dir, nvccs = fake_tools(tmp_path, gpu, nvcc_majors=(12, 13))
    # A CUDA 12 and a CUDA 13 nvcc on the machine: the one of the chosen major is taken.
    r, out = choose(tmp_path, bin_dir, CUDACXX="", PATH=f"{bin_dir}:{Path(nvccs[int(major)]).parent}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    assert out["KILN_CUDA_MAJOR"] == major and out["KILN_TORCH_VERSION"] == torch
    assert out["KILN_VENV"].endswith("venv-cu12" if major == "12" else "venv")
    assert reason in out["KILN_CHOICE_WHY"]


def test_kiln_cuda_forces_either_build(tmp_path):
    bin_dir, nvccs = fake_tools(tmp_path, "h100-r580", nvcc_majors=(12,))
    r, out = choose(tmp_path, bin_dir, KILN_CUDA="12", CUDACXX=nvccs[12])
    assert r.returncode == 0 and out["KILN_CUDA_MAJOR"] == "12" and out["CUDACXX"] == nvccs[12]
    r, out = choose(tmp_path, bin_dir, KILN_CUDA="11")
    assert r.returncode == 1 and "KILN_CUDA=11" in r.stderr


def test_an_nvcc_of_the_other_major_stops_set_up_in_one_line(tmp_path):
    # An H100 on R580 wants the CUDA 13 build, but the only nvcc is CUDA 12: one line naming both.
    bin_dir, nvccs = fake_tools(tmp_path, "h100-r580", nvcc_majors=(12,))
    r, _ = choose(tmp_path, bin_dir, CUDACXX=nvccs[12])
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "CUDA 13 build" in lines[0] and "CUDA 12" in lines[0] and "CUDACXX" in lines[0], r.stderr


def test_a_cuda_12_machine_without_a_cuda_12_nvcc_fetches_one(tmp_path):
    # A V100 with only the CUDA 13 toolkit: set-up will fetch Debian's CUDA 12.4 into the cache.
    bin_dir, nvccs = fake_tools(tmp_path, "v100-r535", nvcc_majors=(13,))
    r, out = choose(tmp_path, bin_dir, PATH=f"{bin_dir}:{Path(nvccs[13]).parent}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    assert out["KILN_FETCH_CUDA12"] == "1" and out["CUDACXX"].endswith("kiln/cuda-12/bin/nvcc")
