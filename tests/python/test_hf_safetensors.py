"""kiln's safetensors reader and writer against the reference implementation (PyPI `safetensors`).

Files written by the Python package are read by kiln and written again (`kiln-hf copy`); the
package reads kiln's file back and every tensor must be bit-identical, with the metadata kept.
Every dtype both sides know is covered, plus scalars, empty tensors and odd sizes that leave
later tensors misaligned. Bad files must fail with kiln's message naming the file and tensor.
"""
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def random_tensor(dtype, shape, g):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    nbytes = torch.empty(0, dtype=dtype).element_size() * int(torch.tensor(shape).prod().item() if shape else 1)
    raw = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
    t = raw.view(dtype).reshape(shape)
    if dtype.is_floating_point or dtype.is_complex:  # keep NaN payloads out: equality must be meaningful
        t = torch.where(torch.isnan(t), torch.zeros_like(t), t)
    return t


def same_bits(a, b):
    def raw(t):  # the bytes, whatever the dtype (equality of floats would let -0.0 == 0.0 pass)
        return t.contiguous().reshape(-1).view(torch.uint8)

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))

def test_files_of_the_reference_round_trip_through_kiln(run_kiln, tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dtype in enumerate(DTYPES):
        tensors[f"t{i}.{str(dtype)[6:]}"] = random_tensor(dtype, (3, 5), g)  # odd byte counts: misaligned successors
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.empty(0, 4, dtype=torch.bfloat16)
    tensors["odd.u8"] = random_tensor(torch.uint8, (7,), g)
    src, dst = tmp_path / "ref.safetensors", tmp_path / "kiln.safetensors"
    save_file(tensors, str(src), metadata={"format": "pt", "note": "ünïcode ✓"})

    res = run_kiln("kiln-hf", "copy", "--in", src, "--out", dst)
    assert res.returncode == 0, res.stderr
    back = load_file(str(dst))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert same_bits(back[name], t), name
    with safe_open(str(dst), "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "ünïcode ✓"}
    assert not list(tmp_path.glob("*.tmp.*"))  # the temporary file was renamed, not left behind

    listing = run_kiln("kiln-hf", "inspect", "--in", dst)
    assert listing.returncode == 0, listing.stderr
    assert "scalar\tF32\t[]" in listing.stdout and "empty\tBF16\t[0, 4]" in listing.stdout


def write_raw(path, header, data=b"", header_len=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)
    return path


@pytest.mark.parametrize("case", ["truncated", "header_past_eof", "bad_json", "unknown_dtype", "size_mismatch",
                                  "out_of_range", "overlap"])
def test_bad_files_fail_with_file_and_tensor_named(run_kiln, tmp_path, case):
    f = tmp_path / f"{case}.safetensors"
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    if case == "truncated":
        f.write_bytes(b"\x10\x00\x00")
        expected = ["too short"]
    elif case == "header_past_eof":
        write_raw(f, {"w": entry}, b"\0" * 8, header_len=10_000)
        expected = ["header length 10000"]
    elif case == "bad_json":
        f.write_bytes(struct.pack("<Q", 5) + b"{\"w\":")
        expected = ["expected valid JSON"]
    elif case == "unknown_dtype":
        write_raw(f, {"w": dict(entry, dtype="F12")}, b"\0" * 8)
        expected = ["'w'", "F12"]
    elif case == "size_mismatch":
        write_raw(f, {"w": dict(entry, shape=[3])}, b"\0" * 8)
        expected = ["'w'", "[3]", "12 bytes"]
    elif case == "out_of_range":
        write_raw(f, {"w": dict(entry, data_offsets=[8, 16])}, b"\0" * 8)
        expected = ["'w'", "[8, 16]", "truncated"]
    else:
        write_raw(f, {"a": entry, "b": dict(entry, data_offsets=[4, 12])}, b"\0" * 12)
        expected = ["'b'", "overlap", "'a'"]
    # Our fixtures are really bad: the reference implementation refuses each one too.
    with pytest.raises(Exception):
        load_file(str(f))
    res = run_kiln("kiln-hf", "copy", "--in", f, "--out", tmp_path / "out.safetensors")
    assert res.returncode == 2, res.stderr
    assert str(f) in res.stderr, res.stderr
    for word in expected:
        assert word in res.stderr, (word, res.stderr)
