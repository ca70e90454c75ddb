"""Hostile and damaged checkpoints (issue 49): each reproducer of the attacker's report, resumed by
kiln-pretrain for real. The checkpoint is a transformers-format one (kiln's checkpoint-4 of a
tiny run without kiln's own files, plus a Trainer's rng_state.pth and training_args.bin written by
torch.save), as people download and share them.

For every case: the resume ends within 60 s and 2 GB (os.wait4's maxrss), by exit status 2 (kiln-pretrain's error) and
not a signal; the last line of stderr names the file and the field; and no file of the checkpoint
changed, nor was anything large written. A resume at the checkpoint's own last step succeeds and
keeps transformers' files.

The torch.save files of the tensor cases are assembled here (`write_pt`: the zip of data.pkl and
data/<key> records, a pickle of `_rebuild_tensor_v2` calls over persistent ids, as
torch.serialization writes them), so that an offset or an element count can be anything; the
untampered assembly of the same state loads in torch and resumes in kiln, so the refusals are of
the tampering alone.
"""
import collections
import hashlib
import io
import os
import pickle
import pickletools
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

STEPS = 4
KEYS = {"model": "tiny", "cutoff_len": 32, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-3, "lr_scheduler_type": "cosine", "warmup_steps": 1, "max_steps": STEPS,
        "logging_steps": 1, "save_steps": STEPS, "eval_steps": 0, "seed": 3}
KILN_FILES = ("kiln_state.json", "loader_state.json", "optimizer.safetensors", "rng_state.safetensors",
              "kiln_data.json")


def resume(kiln_bin, out: Path, ckpt: Path, **overrides):
    """Runs the resume; returns (returncode, stderr, seconds, maxrss bytes)."""
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(dict(KEYS, output_dir=str(out), resume_from_checkpoint=str(ckpt), **overrides)))
    start = time.monotonic()
    with open(out.parent / "stderr.txt", "w+") as err:
        proc = subprocess.Popen([str(kiln_bin("kiln-pretrain")), "--config", str(config)], stdout=subprocess.DEVNULL,
                                stderr=err, cwd=out.parent)
        deadline = start + 60
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                pytest.fail(f"the resume of {ckpt} ran past 60 s")
            time.sleep(0.05)
        err.seek(0)
        stderr = err.read()
    code = os.waitstatus_to_exitcode(status)
    return code, stderr, time.monotonic() - start, usage.ru_maxrss * 1024


def digest(folder: Path):
    """{relative path: sha256 or the link target} of everything under folder."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_fifo():
            out[rel] = "fifo"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---- torch.save files assembled by hand -----------------------------------------------------------

class Storage:
    def __init__(self, key, numel, cls=None):
        self.key, self.numel, self.cls = key, numel, cls or torch.FloatStorage


class Tensor:
    """A tensor as torch.save pickles one: _rebuild_tensor_v2(storage, offset, size, stride, False, {})."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return "storage", obj.cls, obj.key, "cpu", obj.numel
        return None


def long1_in_8_bytes(data: bytes) -> bytes:
    """Every LONG1 rewritten with 8 bytes: Python's pickler writes the fewest, LibTorch reads only 8
    (an integer beyond 32 bits in a file LibTorch reads, such as 2^40, is written that way)."""
    out, last = [], 0
    for op, arg, pos in pickletools.genops(data):
        if op.name == "LONG1":
            n = data[pos + 1]
            out += [data[last:pos], b"\x8a\x08", arg.to_bytes(8, "little", signed=True)]
            last = pos + 2 + n
    return b"".join(out) + data[last:]


def write_pt(path: Path, obj, records, pickle_bytes=None):
    """A torch.save archive: data.pkl (obj pickled, or pickle_bytes as given) and data/<key> records."""
    if pickle_bytes is None:
        buf = io.BytesIO()
        Pickler(buf, protocol=2).dump(obj)
        pickle_bytes = long1_in_8_bytes(buf.getvalue())
    if path.exists() or path.is_symlink():
        path.unlink()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
        z.writestr("archive/byteorder", "little")


def assembled(state):
    """state with every tensor replaced by a Tensor over a record of its own; returns (obj, records)."""
    records = {}

    def walk(v):
        if isinstance(v, torch.Tensor):
            key = str(len(records))
            t = v.detach().contiguous()
            records[key] = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
            cls = {torch.float32: torch.FloatStorage, torch.float64: torch.DoubleStorage}[t.dtype]
            return Tensor(Storage(key, t.numel(), cls), 0, t.shape, t.stride())
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        return v

    return walk(state), records


def nested_lists(depth):
    """A pickle of `depth` nested lists (Python's pickler would recurse too deep to write it)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


# ---- the checkpoint --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(kiln_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    out = root / "train"
    config = root / "train.yaml"
    config.write_text(yaml.safe_dump(dict(KEYS, output_dir=str(out))))
    res = subprocess.run([str(kiln_bin("kiln-pretrain")), "--config", str(config)], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = root / "pristine" / f"checkpoint-{STEPS}"
    shutil.copytree(out / f"checkpoint-{STEPS}", ckpt)
    for name in KILN_FILES:
        (ckpt / name).unlink(missing_ok=True)
    # What transformers' Trainer writes beside its checkpoint and kiln does not read.
    torch.save({"python": [1, 2, 3], "cpu": torch.get_rng_state()}, ckpt / "rng_state.pth")
    torch.save({"output_dir": "elsewhere", "learning_rate": 1e-3}, ckpt / "training_args.bin")
    return ckpt


@pytest.fixture
def case(pristine, tmp_path):
    """A fresh copy of the checkpoint under tmp/run/, and a checker of one refused resume."""
    out = tmp_path / "run"
    ckpt = out / f"checkpoint-{STEPS}"
    shutil.copytree(pristine, ckpt)

    class Case:
        path = ckpt

        def refused(self, kiln_bin, file, *needles, **overrides):
            before = digest(out)
            code, stderr, seconds, rss = resume(kiln_bin, out, ckpt, **overrides)
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
            assert code == 2, f"exit {code} (a signal when negative): {stderr[-2000:]}"
            assert f"{file}:" in last and "expected" in last and "found" in last, last
            for needle in needles:
                assert needle in last, last
            assert len(last) < 2000
            assert seconds < 60 and rss < 2 << 30, (seconds, rss)
            assert digest(out) == before, "a file of the checkpoint or output_dir changed"
            sizes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
            assert sizes < 64 << 20
            print(f"{file}: refused in {seconds:.1f} s, {rss / 2**20:.0f} MB: {last[len('kiln-pretrain: error: '):]}")
            return last

    return Case()


def test_the_pristine_checkpoint_and_its_reassembly_resume(pristine, kiln_bin, tmp_path):
    # Resumed at its own last step: nothing to train, and the checkpoint is kept as it is,
    # transformers' rng_state.pth and training_args.bin included (they were deleted before).
    out = tmp_path / "run"
    ckpt = out / f"checkpoint-{STEPS}"
    shutil.copytree(pristine, ckpt)
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    obj, records = assembled(opt)
    write_pt(ckpt / "optimizer.pt", obj, records)
    again = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert all(torch.equal(again["state"][i][k], opt["state"][i][k]) for i in opt["state"] for k in opt["state"][i])
    before = digest(ckpt)
    code, stderr, seconds, _ = resume(kiln_bin, out, ckpt)
    assert code == 0, stderr[-3000:]
    assert "kept as it is" in stderr
    assert digest(ckpt) == before


def test_output_dir_may_not_be_the_checkpoint(case, kiln_bin):
    before = digest(case.path)
    code, stderr, _, _ = resume(kiln_bin, case.path, case.path)
    assert code == 2 and "is the checkpoint being resumed" in stderr.strip().splitlines()[-1]
    assert digest(case.path) == before


# Tensors pointing outside their records (11 SIGSEGVs, and silent loads with heap bytes).

def tampered_optimizer(ckpt: Path, change):
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    obj, records = assembled(opt)
    change(obj, records)
    write_pt(ckpt / "optimizer.pt", obj, records)


def first_moment(obj):
    return obj["state"][0]["exp_avg"]


def test_a_record_cut_to_zero_bytes(case, kiln_bin):
    tampered_optimizer(case.path, lambda obj, rec: rec.update({first_moment(obj).args[0].key: b""}))
    case.refused(kiln_bin, "optimizer.pt", "expected a storage within its record data/")


def test_a_record_cut_short(case, kiln_bin):
    def cut(obj, rec):
        key = first_moment(obj).args[0].key
        rec[key] = rec[key][: len(rec[key]) // 2]
    tampered_optimizer(case.path, cut)
    case.refused(kiln_bin, "optimizer.pt", "expected a storage within its record data/")


def test_numel_2_40_at_offset_2_36(case, kiln_bin):
    def huge(obj, rec):
        t = first_moment(obj)
        t.args = (Storage(t.args[0].key, 2**40), 2**36) + t.args[2:]
    tampered_optimizer(case.path, huge)
    case.refused(kiln_bin, "optimizer.pt", "1099511627776 elements")


@pytest.mark.parametrize("offset", [-1, -40960])
def test_a_negative_storage_offset(case, kiln_bin, offset):
    def shift(obj, rec):
        t = first_moment(obj)
        t.args = (t.args[0], offset) + t.args[2:]
    tampered_optimizer(case.path, shift)
    case.refused(kiln_bin, "optimizer.pt", "state[0].exp_avg: expected a storage offset >= 0", f"found {offset}")


def test_a_view_past_its_record(case, kiln_bin):
    def shift(obj, rec):
        t = first_moment(obj)
        t.args = (t.args[0], 1) + t.args[2:]
    tampered_optimizer(case.path, shift)
    case.refused(kiln_bin, "optimizer.pt", "state[0].exp_avg: expected a view within its storage")


# Deep nesting, memory blow-ups, hangs.

def test_a_million_nested_lists(case, kiln_bin):
    write_pt(case.path / "optimizer.pt", None, {}, pickle_bytes=nested_lists(10**6))
    case.refused(kiln_bin, "optimizer.pt", "data.pkl", "nested at most 32 deep")


@pytest.mark.parametrize("depth", [15000, 10**6])
def test_a_deep_log_history(case, kiln_bin, depth):
    state = (case.path / "trainer_state.json").read_text()
    (case.path / "trainer_state.json").write_text(state.replace('"log_history": [', '"log_history": [' + "[" * depth
                                                                 + "]" * depth + ",", 1))
    case.refused(kiln_bin, "trainer_state.json", "nested at most 64 levels deep")


def test_a_memo_index_of_0x12000000(case, kiln_bin):
    write_pt(case.path / "optimizer.pt", None, {}, pickle_bytes=b"\x80\x02Nr\x00\x00\x00\x12.")
    case.refused(kiln_bin, "optimizer.pt", "data.pkl, byte 3: expected a memo index at most 0")


def test_a_string_declaring_4_gb(case, kiln_bin):
    write_pt(case.path / "scheduler.pt", None, {}, pickle_bytes=b"\x80\x02X\xff\xff\xff\xffabc.")
    case.refused(kiln_bin, "scheduler.pt", "expected 4294967295 more bytes")


def test_trainer_state_linked_to_dev_zero(case, kiln_bin):
    (case.path / "trainer_state.json").unlink()
    (case.path / "trainer_state.json").symlink_to("/dev/zero")
    case.refused(kiln_bin, "trainer_state.json", "expected a regular file, found a character device")


@pytest.mark.parametrize("name", ["trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors"])
def test_a_fifo_in_place_of_a_file(case, kiln_bin, name):
    (case.path / name).unlink()
    os.mkfifo(case.path / name)
    case.refused(kiln_bin, name, "expected a regular file, found a FIFO")


# Accepted nonsense, and messages that named no file.

def test_an_infinite_learning_rate(case, kiln_bin):
    sched = torch.load(case.path / "scheduler.pt", weights_only=True)
    sched["_last_lr"] = [float("inf")] * len(sched["_last_lr"])
    torch.save(sched, case.path / "scheduler.pt")
    case.refused(kiln_bin, "scheduler.pt", "_last_lr[0]: expected a finite number, found inf")


@pytest.mark.parametrize("value,found", [("4.5", "the number 4.5"), ("18446744073709551616", "the number"),
                                         ("4.0", "the number 4.0"), ('"4"', 'the string "4"')])
def test_a_global_step_that_is_not_an_integer(case, kiln_bin, value, found):
    path = case.path / "trainer_state.json"
    path.write_text(path.read_text().replace(f'"global_step": {STEPS}', f'"global_step": {value}', 1))
    case.refused(kiln_bin, "trainer_state.json", "global_step: expected an integer", found)


@pytest.mark.parametrize("step,found", [(torch.tensor(1e30), "a whole number in [0, 9007199254740992]"),
                                        (torch.tensor(True), "a Bool tensor"),
                                        (torch.tensor(9.0), f"a whole number of steps in [0, {STEPS}], found 9")])
def test_an_optimizer_step_out_of_range(case, kiln_bin, step, found):
    opt = torch.load(case.path / "optimizer.pt", weights_only=True)
    opt["state"][0]["step"] = step
    torch.save(opt, case.path / "optimizer.pt")
    case.refused(kiln_bin, "optimizer.pt", "state[0].step: expected", found)


def test_an_optimizer_file_that_is_not_a_dict(case, kiln_bin):
    torch.save([1, 2, 3], case.path / "optimizer.pt")
    case.refused(kiln_bin, "optimizer.pt", "(the top level): expected a dict, found a list of 3")


def test_pickled_code_is_refused_before_it_runs(case, kiln_bin, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    write_pt(case.path / "scheduler.pt", None, {}, pickle_bytes=pickle.dumps(Payload(), protocol=2))
    case.refused(kiln_bin, "scheduler.pt", "found posix.system")
    assert not marker.exists()
