"""kiln-bench --predict: the machine-code predictions of scripts/check_kernel_sass.py reach the
program. The reference is docs/kernel_sass.json itself (what the script wrote and the kernel_sass
test keeps true to the sources), read here independently: every op, dtype and device it holds is
printed with min(1, headroom) and the headroom, and the fused-ops table gets its column."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_predict_prints_every_headroom_of_the_json(run_kiln):
    doc = json.loads((ROOT / "docs" / "kernel_sass.json").read_text())
    out = run_kiln("kiln-bench", "--ops", "rmsnorm", "--tokens", "64", "--hidden", "64", "--iters", "1", "--predict")
    assert out.returncode == 0, out.stderr
    header = re.search(r"^\| op \| dtype \|(.*)$", out.stdout, re.M)
    assert header, out.stdout
    devices = [re.match(r"\s*(\S+) \(sm_(\d+)\)", c).group(1) for c in header.group(1).split("|") if c.strip()]
    assert sorted(devices) == sorted(doc["devices"])
    printed = 0
    for op, by_dtype in doc["headroom"].items():
        for dtype, cells in by_dtype.items():
            row = re.search(rf"^\| {op} \| {dtype} \|(.*)$", out.stdout, re.M)
            assert row, f"{op} {dtype} missing:\n{out.stdout}"
            got = [c.strip() for c in row.group(1).split("|") if c.strip()]
            for device, cell in zip(devices, got):
                h = cells[device]
                assert cell == f"{100 * min(1.0, h):.0f}% ({h:.1f}x)", (op, dtype, device, cell)
                printed += 1
    assert printed >= 9 * 3  # rmsnorm, rope, swiglu x fp32/bf16/fp16 x three devices
    # The fused-ops table has the column; on the CPU it holds no prediction.
    assert re.search(r"\| of copy \| predicted \| peak extra MiB \|", out.stdout)
    assert re.search(r"^\| rmsnorm fwd\+bwd \| kiln \|.*\| - \|", out.stdout, re.M)


def test_every_memory_bound_op_has_its_kernels_on_each_architecture():
    doc = json.loads((ROOT / "docs" / "kernel_sass.json").read_text())
    for op in ("rmsnorm", "rope", "swiglu"):
        for arch in (70, 80, 90):
            kernels = [k for k in doc["kernels"] if k["op"] == op and k["arch"] == arch]
            assert {k["dtype"] for k in kernels} == {"fp32", "bf16", "fp16"}, (op, arch)
            need = doc["needed_kb_per_sm"][str(arch)]
            assert all(k["kb_in_flight_per_sm"] >= need for k in kernels), (op, arch)
