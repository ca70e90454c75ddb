"""A run moves between kiln and transformers' Trainer at a checkpoint, both ways (issue 44).

The fixture is LLaMA-Factory's (llamafactory_reference.make_fixture: a tiny random Llama with a
byte-level BPE, two `dataset:` files). kiln trains it from an LF YAML (stage pt); transformers'
Trainer trains the same model on the same examples: kiln's own dump of them (`--dry-run
--dump-data`, whose order and labels tests/python/test_lf_parity.py checks against LLaMA-Factory),
fed through a collator that stacks them as they are, with the same arguments (fp32 on the CPU,
adamw_torch_fused, cosine with warmup, weight decay, gradient accumulation). Each program runs 8
steps and saves at 4 and 8. Then:

- kiln -> Trainer: Trainer resumes from kiln's checkpoint-4 (weights, optimizer.pt, scheduler.pt,
  trainer_state.json). The AdamW state it loaded is bit-equal to kiln's own (optimizer.safetensors
  of the same checkpoint); steps 5-8 have the uninterrupted Trainer run's learning rates exactly
  and its losses within 1e-5.
- Trainer -> kiln: kiln resumes from Trainer's checkpoint-4. What kiln loads (`kiln-hf optimizer`,
  the same reader and AdamW.load_state_dict as the resume) is bit-equal to Trainer's optimizer
  state, also from a file whose storages say they were saved on "cuda:0"; steps 5-8 have the uninterrupted kiln run's learning rates exactly and its losses within
  1e-5.
- The first 4 steps of the two programs agree within 1e-5 (the same data in the same order), so
  the continued runs compare with something that could have differed.
- A checkpoint whose schedule is not the YAML's, whose groups are not the model's, or a DeepSpeed
  folder is refused in one line naming the file and field.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")
from safetensors.torch import load_file  # noqa: E402

from llamafactory_reference import make_fixture  # noqa: E402

STEPS, SAVE = 8, 4
KEYS = {
    "stage": "pt", "do_train": True, "finetuning_type": "full", "report_to": "none", "dataset": "docs_a,docs_b",
    "cutoff_len": 32, "max_samples": 40, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
    "learning_rate": 1.0e-3, "lr_scheduler_type": "cosine", "warmup_steps": 2, "weight_decay": 0.01,
    "max_steps": STEPS, "logging_steps": 1, "save_steps": SAVE, "seed": 7, "device": "cpu",
}


def kiln_pretrain(kiln_bin, fixture, out: Path, *extra: str, **overrides):
    keys = dict(KEYS, model_name_or_path=fixture["model"], dataset_dir=fixture["data"], output_dir=str(out))
    keys.update(overrides)
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(keys, sort_keys=False))
    env = dict(os.environ, KILN_HOME=str(out.parent / "kiln-home"))
    return subprocess.run([str(kiln_bin("kiln-pretrain")), "--config", str(config), *extra], capture_output=True,
                          text=True, timeout=300, env=env, cwd=out.parent)


def kiln_steps(out: Path):
    """{step: (loss, learning_rate)} of kiln's metrics.jsonl (full precision)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["learning_rate"]) for r in rows if "loss" in r}


class Examples(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def stack(features):
    return {key: torch.tensor([f[key] for f in features]) for key in ("input_ids", "labels")}


class Loaded(transformers.TrainerCallback):
    """What Trainer holds when training begins (after it loaded the checkpoint)."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.states = [{k: v.clone() for k, v in optimizer.state[p].items()}
                       for g in optimizer.param_groups for p in g["params"]]
        self.lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_lr = list(lr_scheduler.get_last_lr())


def trainer_run(fixture, examples, out: Path, resume=None):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture["model"], dtype=torch.float32)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=1e-3, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01, logging_steps=1,
        save_steps=SAVE, seed=7, report_to="none", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        optim="adamw_torch_fused")
    loaded = Loaded()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Examples(examples), data_collator=stack,
                                   callbacks=[loaded])
    # kiln normalises a step's loss as LLaMA-Factory 0.9.5's transformers (5.6) does: by the labels
    # that are not -100 before the shift (num_items_in_batch); transformers 5.24 counts them after it.
    if hasattr(trainer, "_loss_shifts_labels"):
        trainer._loss_shifts_labels = False
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    steps = {h["step"]: (h["loss"], h["learning_rate"]) for h in trainer.state.log_history if "loss" in h}
    return steps, loaded


@pytest.fixture(scope="module")
def runs(kiln_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    fixture = make_fixture(str(root / "fixture"))
    dump = root / "examples.json"
    res = kiln_pretrain(kiln_bin, fixture, root / "dry", "--dry-run", "--dump-data", str(dump))
    assert res.returncode == 0, res.stderr[-3000:]
    examples = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in json.loads(dump.read_text())["train"]
                ["examples"]]
    kiln_out = root / "kiln"
    res = kiln_pretrain(kiln_bin, fixture, kiln_out)
    assert res.returncode == 0, res.stderr[-3000:]
    hf_out = root / "hf"
    hf_steps, _ = trainer_run(fixture, examples, hf_out)
    return {"root": root, "fixture": fixture, "examples": examples, "kiln": kiln_out, "kiln_steps": kiln_steps(kiln_out),
            "hf": hf_out, "hf_steps": hf_steps}


def test_the_two_programs_train_the_same_first_steps(runs):
    kiln, hf = runs["kiln_steps"], runs["hf_steps"]
    assert sorted(kiln) == sorted(hf) == list(range(1, STEPS + 1))
    for step in range(1, SAVE + 1):
        assert kiln[step][1] == hf[step][1], step
        assert abs(kiln[step][0] - hf[step][0]) < 1e-5, (step, kiln[step], hf[step])
    print(f"kiln vs Trainer, steps 1-{SAVE}: max |loss diff| "
          f"{max(abs(kiln[s][0] - hf[s][0]) for s in range(1, SAVE + 1)):.2e}")


def test_trainer_continues_a_kiln_checkpoint(runs, tmp_path):
    ckpt = tmp_path / f"checkpoint-{SAVE}"
    shutil.copytree(runs["kiln"] / f"checkpoint-{SAVE}", ckpt)
    assert not (ckpt / "rng_state.pth").exists() and not (ckpt / "training_args.bin").exists()
    steps, loaded = trainer_run(runs["fixture"], runs["examples"], tmp_path / "out", resume=ckpt)

    # What Trainer loaded is kiln's optimizer state, bit for bit, in HF's group order.
    kiln_state = load_file(str(ckpt / "optimizer.safetensors"))
    names = [n for n, p in transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).named_parameters()]
    decay = [n for n in names if "norm" not in n]
    order = decay + [n for n in names if n not in decay]
    assert len(loaded.states) == len(order)
    worst = 0.0
    for name, state in zip(order, loaded.states):
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].dtype == torch.float32
            assert torch.equal(state[key], kiln_state[f"{name}.{key}"]), (name, key)
            worst = max(worst, (state[key] - kiln_state[f"{name}.{key}"]).abs().max().item())
        assert state["step"].item() == SAVE and state["step"].dim() == 0
    assert worst == 0.0
    # The schedule goes on where it was: the next step's rate, as the uninterrupted run's.
    hf = runs["hf_steps"]
    assert loaded.last_lr == loaded.lrs == [hf[SAVE + 1][1]] * 2
    # Trainer carries kiln's log history on (steps 1-4 are kiln's), then logs its own.
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert all(steps[step] == runs["kiln_steps"][step] for step in range(1, SAVE + 1))
    for step in range(SAVE + 1, STEPS + 1):
        assert steps[step][1] == hf[step][1], step
        assert abs(steps[step][0] - hf[step][0]) < 1e-5, (step, steps[step], hf[step])
    print(f"kiln -> Trainer, steps {SAVE + 1}-{STEPS}: max |loss diff| "
          f"{max(abs(steps[s][0] - hf[s][0]) for s in range(SAVE + 1, STEPS + 1)):.2e}")


def test_kiln_continues_a_trainer_checkpoint(runs, run_kiln, kiln_bin, tmp_path):
    ckpt = tmp_path / "run" / f"checkpoint-{SAVE}"
    shutil.copytree(runs["hf"] / f"checkpoint-{SAVE}", ckpt)
    assert (ckpt / "rng_state.pth").exists() and (ckpt / "optimizer.pt").exists()

    # What kiln's resume loads of optimizer.pt is Trainer's state, bit for bit.
    res = run_kiln("kiln-hf", "optimizer", "--model", ckpt, "--out", tmp_path / "loaded.safetensors")
    assert res.returncode == 0, res.stderr
    loaded = load_file(str(tmp_path / "loaded.safetensors"))
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    names = [n for n, _ in transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).named_parameters()]
    order = [n for n in names if "norm" not in n] + [n for n in names if "norm" in n]
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    assert len(ids) == len(order) == len(loaded) // 3
    for i, name in zip(ids, order):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded[f"{name}.{key}"], saved["state"][i][key]), (name, key)

    # Saved from a GPU (the storages' location "cuda:0"): kiln reads it on the CPU all the same.
    gpu = tmp_path / "gpu"
    shutil.copytree(ckpt, gpu)
    location_tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(saved, gpu / "optimizer.pt")
    finally:
        torch.serialization.location_tag = location_tag
    assert b"cuda:0" in (gpu / "optimizer.pt").read_bytes()
    res = run_kiln("kiln-hf", "optimizer", "--model", gpu, "--out", tmp_path / "gpu.safetensors")
    assert res.returncode == 0, res.stderr
    assert all(torch.equal(t, loaded[k]) for k, t in load_file(str(tmp_path / "gpu.safetensors")).items())

    out = tmp_path / "run"
    res = kiln_pretrain(kiln_bin, runs["fixture"], out, resume_from_checkpoint=str(ckpt))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rng_state.pth: ignored" in res.stderr
    steps = kiln_steps(out)
    kiln = runs["kiln_steps"]
    assert sorted(steps) == list(range(SAVE + 1, STEPS + 1))
    for step in steps:
        assert steps[step][1] == kiln[step][1], step
        assert abs(steps[step][0] - kiln[step][0]) < 1e-5, (step, steps[step], kiln[step])
    print(f"Trainer -> kiln, steps {SAVE + 1}-{STEPS}: max |loss diff| "
          f"{max(abs(steps[s][0] - kiln[s][0]) for s in steps):.2e}")
    # trainer_state.json carries Trainer's log history on.
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "loss" in h] == list(range(1, STEPS + 1))


def test_mismatches_are_refused_naming_file_and_field(runs, kiln_bin, tmp_path):
    ckpt = tmp_path / "run" / f"checkpoint-{SAVE}"
    shutil.copytree(runs["hf"] / f"checkpoint-{SAVE}", ckpt)

    def refused(*needles, **overrides):
        res = kiln_pretrain(kiln_bin, runs["fixture"], tmp_path / "run", resume_from_checkpoint=str(ckpt), **overrides)
        assert res.returncode != 0
        last = res.stderr.strip().splitlines()[-1]
        for needle in needles:
            assert needle in last, last
        return last

    refused("scheduler.pt: _last_lr[0]: expected", "lr_scheduler_type linear", lr_scheduler_type="linear")
    refused("scheduler.pt: _last_lr[0]: expected", "3 warmup steps", warmup_steps=3)
    refused("trainer_state.json: max_steps: expected this run's 10 steps", "found 8", max_steps=10)
    # Another group layout: the norms moved into the decay group.
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    groups = opt["param_groups"]
    groups[0]["params"] += groups[1]["params"][:1]
    groups[1]["params"] = groups[1]["params"][1:]
    torch.save(opt, ckpt / "optimizer.pt")
    refused("optimizer.pt: param_groups[0].params: expected", "weights with weight decay")
    # Another optimizer (SGD's state has no moments).
    torch.save({"state": {}, "param_groups": [{"lr": 1e-3, "momentum": 0.9, "params": []}] * 2}, ckpt / "optimizer.pt")
    refused("optimizer.pt: param_groups[0].betas: expected", "another optimizer")
    (ckpt / "global_step4").mkdir()
    refused("DeepSpeed", "global_step4", "zero_to_fp32")


# ---- LLaMA-Factory 0.9.5 itself -----------------------------------------------------------------

LF_PYTHON = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln")) / "venv-lf" / "bin" / "python"
LF_SCRIPT = Path(__file__).resolve().parent / "llamafactory_reference.py"
LF_KEYS = {k: v for k, v in KEYS.items() if k not in ("stage", "do_train", "finetuning_type", "report_to", "dataset",
                                                      "device")}
LF_KEYS.update(val_size=0.0, do_eval=False, eval_strategy="no")


def lf_run(fixture, out: Path, *extra: str):
    # warmup_ratio: None drops llamafactory_reference's default (transformers 5.6 lets a ratio
    # override warmup_steps); json.dumps, as YAML reads a bare `no` as false.
    kv = [f"{k}={json.dumps(v)}" for k, v in dict(LF_KEYS, warmup_ratio=None).items()]
    res = subprocess.run([str(LF_PYTHON), str(LF_SCRIPT), "--train-run", str(out), "--data", fixture["data"],
                          "--model", fixture["model"], *extra, *kv], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: (h["loss"], h["learning_rate"]) for h in history if "loss" in h}


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")
@pytest.mark.skipif(not LF_PYTHON.exists(), reason="no LLaMA-Factory reference venv: scripts/setup_lf_reference.sh")
def test_llamafactory_and_kiln_continue_each_others_checkpoints(kiln_bin, run_kiln, tmp_path):
    made = subprocess.run([str(LF_PYTHON), str(LF_SCRIPT), "--make-fixture", str(tmp_path / "fixture")],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    fixture = json.loads(made.stdout)
    lf_keys = dict(LF_KEYS, stage="pt", do_train=True, finetuning_type="full", report_to="none",
                   dataset="docs_a,docs_b")

    lf_full = lf_run(fixture, tmp_path / "lf" / "run")
    (tmp_path / "kiln").mkdir()
    res = kiln_pretrain(kiln_bin, fixture, tmp_path / "kiln" / "run", **dict(lf_keys, device="cpu"))
    assert res.returncode == 0, res.stderr[-3000:]
    kiln_full = kiln_steps(tmp_path / "kiln" / "run")
    # LLaMA-Factory's own order and normalisation: the two programs' first steps agree.
    for step in range(1, SAVE + 1):
        assert kiln_full[step][1] == lf_full[step][1] and abs(kiln_full[step][0] - lf_full[step][0]) < 1e-5, step

    # kiln -> LLaMA-Factory: its output_dir holds kiln's checkpoint-4, which it resumes on its own.
    resumed = tmp_path / "lf_resumed" / "run"
    shutil.copytree(tmp_path / "kiln" / "run" / f"checkpoint-{SAVE}", resumed / f"checkpoint-{SAVE}")
    loaded_file = tmp_path / "lf_loaded.safetensors"
    steps = lf_run(fixture, resumed, "--keep-output", "--dump-loaded", str(loaded_file))
    from safetensors import safe_open
    with safe_open(str(loaded_file), "pt") as f:
        meta = f.metadata()
        loaded = {k: f.get_tensor(k) for k in f.keys()}
    assert int(meta["global_step"]) == SAVE
    kiln_opt = torch.load(resumed / f"checkpoint-{SAVE}" / "optimizer.pt", weights_only=True)
    kiln_state = load_file(str(resumed / f"checkpoint-{SAVE}" / "optimizer.safetensors"))
    names = [n for n, _ in transformers.AutoModelForCausalLM.from_pretrained(fixture["model"]).named_parameters()]
    order = [n for n in names if "norm" not in n] + [n for n in names if "norm" in n]
    assert len(loaded) == 3 * len(order)
    for i, name in enumerate(order):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[f"{i}.{key}"], kiln_state[f"{name}.{key}"]), (name, key)
            assert torch.equal(loaded[f"{i}.{key}"], kiln_opt["state"][i][key]), (name, key)
        assert loaded[f"{i}.step"].item() == SAVE
    assert json.loads(meta["last_lr"]) == [lf_full[SAVE + 1][1]] * 2
    for step in range(SAVE + 1, STEPS + 1):
        assert steps[step][1] == lf_full[step][1], step
        assert abs(steps[step][0] - lf_full[step][0]) < 1e-5, (step, steps[step], lf_full[step])

    # LLaMA-Factory -> kiln: resume_from_checkpoint: true finds LLaMA-Factory's checkpoint-4.
    resumed = tmp_path / "kiln_resumed" / "run"
    ckpt = resumed / f"checkpoint-{SAVE}"
    shutil.copytree(tmp_path / "lf" / "run" / f"checkpoint-{SAVE}", ckpt)
    res = run_kiln("kiln-hf", "optimizer", "--model", ckpt, "--out", tmp_path / "kiln_loaded.safetensors")
    assert res.returncode == 0, res.stderr
    kiln_loaded = load_file(str(tmp_path / "kiln_loaded.safetensors"))
    lf_opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    ids = [i for g in lf_opt["param_groups"] for i in g["params"]]
    for i, name in zip(ids, order):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(kiln_loaded[f"{name}.{key}"], lf_opt["state"][i][key]), (name, key)
    res = kiln_pretrain(kiln_bin, fixture, resumed, **dict(lf_keys, device="cpu", resume_from_checkpoint=True))
    assert res.returncode == 0, res.stderr[-3000:]
    steps = kiln_steps(resumed)
    assert sorted(steps) == list(range(SAVE + 1, STEPS + 1))
    for step in steps:
        assert steps[step][1] == kiln_full[step][1], step
        assert abs(steps[step][0] - kiln_full[step][0]) < 1e-5, (step, steps[step], kiln_full[step])
