"""output_dir and checkpoints as LLaMA-Factory 0.9.5 leaves them (issue 29, point 4).

A LLaMA-Factory pretraining YAML runs on a model folder whose tokenizer.json is a real HF
tokenizer (llamafactory_reference.make_fixture: a byte-level BPE, a tiny random Llama, two
datasets). Then:
- the file lists of output_dir and of a checkpoint are LLaMA-Factory's (LF_OUTPUT_FILES and
  LF_CHECKPOINT_FILES, from a real `llamafactory_reference.py --train-run` with the same keys),
  less the Python pickles kiln cannot write, plus kiln's documented equivalents;
- transformers loads the model and the tokenizer from output_dir and from a checkpoint; the
  loaded model's logits equal kiln's own forward of the saved weights (kiln-hf forward);
- trainer_log.jsonl is LLaMA-Factory's line format byte for byte (json.dumps of the parsed line
  gives the line back, LogCallback's key order), eval_results.json has LLaMA-Factory's keys,
  README.md is transformers' model card, generation_config.json has transformers' aligned
  special tokens;
- do_eval / eval_strategy follow HF's rules, and a run resumed from one of these checkpoints
  logs the same losses as the uninterrupted run.

The `[slow]` test (KILN_SLOW_TESTS=1, with the reference venv of scripts/setup_lf_reference.sh)
runs the real LLaMA-Factory on the same fixture and compares file lists and JSON keys and values.
"""
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")
from safetensors.torch import load_file, save_file  # noqa: E402

from llamafactory_reference import make_fixture  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# What `llamafactory_reference.py --train-run` (llamafactory 0.9.5, transformers 5.6.0) leaves with
# do_eval and save_steps (docs/llamafactory.md, section 7).
LF_OUTPUT_FILES = {"README.md", "all_results.json", "chat_template.jinja", "config.json", "eval_results.json",
                   "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "train_results.json", "trainer_log.jsonl", "trainer_state.json", "training_args.bin"}
LF_CHECKPOINT_FILES = {"chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                       "optimizer.pt", "rng_state.pth", "scheduler.pt", "tokenizer.json", "tokenizer_config.json",
                       "trainer_state.json", "training_args.bin"}
# Python pickles kiln does not write -> kiln's files for them (docs/training.md, "Coming from
# LLaMA-Factory"). optimizer.pt and scheduler.pt are written as transformers' Trainer writes them
# (tests/python/test_hf_trainer_resume.py), beside kiln's own optimizer.safetensors.
PICKLES = {"training_args.bin": "training_args.json", "rng_state.pth": "rng_state.safetensors"}
KILN_OUTPUT_EXTRA = {"kiln_data.json", "metrics.jsonl"}
KILN_CHECKPOINT_EXTRA = {"kiln_data.json", "kiln_state.json", "loader_state.json", "optimizer.safetensors"}
LOG_KEYS = ["current_steps", "total_steps", "loss", "eval_loss", "predict_loss", "reward", "accuracy", "lr", "epoch",
            "percentage", "elapsed_time", "remaining_time"]
EVAL_RESULT_KEYS = {"epoch", "eval_loss", "eval_perplexity", "eval_runtime", "eval_samples_per_second",
                    "eval_steps_per_second"}
TRAIN_RESULT_KEYS = {"epoch", "total_flos", "train_loss", "train_runtime", "train_samples_per_second",
                     "train_steps_per_second"}

# The --train-run of docs/llamafactory.md ("How to reproduce") as a YAML: 14 steps, evaluated
# every 2, saved every 2, do_eval after training.
RUN_KEYS = {
    "stage": "pt", "do_train": True, "finetuning_type": "full", "report_to": "none", "dataset": "docs_a,docs_b",
    "logging_steps": 1, "save_steps": 2, "learning_rate": 1.0e-3, "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1, "num_train_epochs": 2.0, "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 3, "cutoff_len": 32, "val_size": 0.1, "do_eval": True,
    "eval_strategy": "steps", "eval_steps": 2, "per_device_eval_batch_size": 4, "max_samples": 40, "seed": 7,
}


def expected_files(lf_files, extra):
    return {PICKLES.get(f, f) for f in lf_files if PICKLES.get(f, f)} | extra


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lffix")
    return make_fixture(str(root))


def kiln_run(kiln_bin, fixture, out: Path, **overrides):
    keys = dict(RUN_KEYS, model_name_or_path=fixture["model"], dataset_dir=fixture["data"], output_dir=str(out),
                device="cpu")
    keys.update(overrides)
    keys = {k: v for k, v in keys.items() if v is not None}
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(keys, sort_keys=False))
    env = dict(os.environ, KILN_HOME=str(out.parent / "kiln-home"))
    res = subprocess.run([str(kiln_bin("kiln-pretrain")), "--config", str(config)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=out.parent)
    return res


def files_of(folder: Path):
    return {p.name for p in folder.iterdir() if p.is_file()}


def log_lines(out: Path):
    text = (out / "trainer_log.jsonl").read_text()
    assert text.endswith("\n")
    return text.splitlines()


def check_log_line(line: str):
    entry = json.loads(line)
    # Byte for byte what LLaMA-Factory's json.dumps writes for these values.
    assert json.dumps(entry) == line
    keys = list(entry)
    assert keys == [k for k in LOG_KEYS if k in entry], keys
    return entry


@pytest.fixture(scope="module")
def full_run(kiln_bin, fixture_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("kiln") / "run"
    res = kiln_run(kiln_bin, fixture_dir, out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res


def test_file_lists_are_llamafactorys(full_run):
    out, _ = full_run
    assert files_of(out) == expected_files(LF_OUTPUT_FILES, KILN_OUTPUT_EXTRA)
    checkpoints = sorted((p for p in out.iterdir() if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in checkpoints] == [f"checkpoint-{s}" for s in range(2, 15, 2)]
    for ckpt in checkpoints:
        assert files_of(ckpt) == expected_files(LF_CHECKPOINT_FILES, KILN_CHECKPOINT_EXTRA), ckpt


def hf_logits(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        return model, model(input_ids=ids).logits


def test_transformers_loads_model_and_tokenizer_from_output_dir_and_checkpoints(full_run, fixture_dir, run_kiln,
                                                                               tmp_path):
    out, _ = full_run
    model_dir = Path(fixture_dir["model"])
    from tokenizers import Tokenizer
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "the city was kiln llama token packing"
    ids = torch.tensor([reference.encode(text).ids * 3])
    batch = tmp_path / "batch.safetensors"
    save_file({"input_ids": ids, "labels": ids.clone()}, str(batch))
    eos = fixture_dir["eos_token_id"]
    final = None
    for folder in (out, out / "checkpoint-8", out / "checkpoint-14"):
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        assert tok(text).input_ids == reference.encode(text).ids
        # LLaMA-Factory's fix-up as saved: pad = eos, right padding; its `empty` chat template.
        assert (tok.pad_token, tok.eos_token, tok.bos_token, tok.padding_side) == ("</s>", "</s>", "<s>", "right")
        assert tok.pad_token_id == eos
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
        assert (folder / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()

        model, logits = hf_logits(folder, ids)
        # transformers' align_special_tokens, as LLaMA-Factory's saved config.
        assert model.config.pad_token_id == eos and model.config.eos_token_id == eos
        assert model.generation_config.eos_token_id == [eos] and model.generation_config.pad_token_id == eos
        # kiln's own forward of the weights it saved.
        res = run_kiln("kiln-hf", "forward", "--model", folder, "--batch", batch, "--out", tmp_path / "out.safetensors")
        assert res.returncode == 0, res.stderr
        kiln = load_file(str(tmp_path / "out.safetensors"))["logits"]
        diff = (kiln.double() - logits.double()).abs().max().item()
        assert diff < 1e-4, (folder, diff)
        if folder == out:
            final = logits
        elif folder.name == "checkpoint-14":
            assert torch.equal(logits, final)  # the final model is the last checkpoint's


def test_trainer_log_results_and_model_card_are_llamafactorys(full_run, fixture_dir):
    out, _ = full_run
    lines = log_lines(out)
    entries = [check_log_line(line) for line in lines]
    train = [e for e in entries if "loss" in e]
    evals = [e for e in entries if "eval_loss" in e]
    # 14 windows (logging_steps 1), 7 periodic evaluations, the summary; the do_eval evaluation
    # after training is not logged (LLaMA-Factory's writer has closed by then).
    assert (len(train), len(evals), len(entries)) == (14, 7, 22)
    assert [e["current_steps"] for e in train] == list(range(1, 15))
    assert [e["current_steps"] for e in evals] == list(range(2, 15, 2))
    assert all(e["total_steps"] == 14 for e in entries)
    assert train[0]["lr"] == 0.0 and train[0]["percentage"] == 7.14 and train[-1]["percentage"] == 100.0
    assert list(entries[-1]) == ["current_steps", "total_steps", "epoch", "percentage", "elapsed_time",
                                 "remaining_time"]
    assert all(e["elapsed_time"].count(":") == 2 for e in entries)

    eval_results = json.loads((out / "eval_results.json").read_text())
    assert set(eval_results) == EVAL_RESULT_KEYS
    assert eval_results["eval_perplexity"] == pytest.approx(math.exp(eval_results["eval_loss"]), rel=1e-12)
    assert eval_results["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], abs=0)  # the step-14 evaluation
    train_results = json.loads((out / "train_results.json").read_text())
    assert set(train_results) == TRAIN_RESULT_KEYS
    assert json.loads((out / "all_results.json").read_text()) == {**train_results, **eval_results}

    state = transformers.TrainerState.load_from_json(str(out / "trainer_state.json"))
    assert state.global_step == 14 and state.log_history[-1]["train_loss"] == train_results["train_loss"]

    model_dir = fixture_dir["model"]
    gen = json.loads((out / "generation_config.json").read_text())
    source = json.loads((Path(model_dir) / "generation_config.json").read_text())
    assert gen == {**source, "eos_token_id": [1], "pad_token_id": 1}
    config = json.loads((out / "config.json").read_text())
    assert (config["pad_token_id"], config["eos_token_id"], config["bos_token_id"]) == (1, 1, 0)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert {k: tok_config[k] for k in ("pad_token", "eos_token", "padding_side", "split_special_tokens")} == {
        "pad_token": "</s>", "eos_token": "</s>", "padding_side": "right", "split_special_tokens": False}
    assert list(tok_config) == sorted(tok_config)
    args = json.loads((out / "training_args.json").read_text())
    assert args["learning_rate"] == 1e-3 and args["seed"] == 7 and args["do_eval"] is True
    assert args["eval_strategy"] == "steps" and args["output_dir"] == str(out)
    assert json.loads((out / "checkpoint-8" / "training_args.json").read_text()) == args

    card = (out / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta == {"library_name": "transformers", "license": "other", "base_model": model_dir,
                    "tags": ["llama-factory", "full", "generated_from_trainer"],
                    "model-index": [{"name": "run", "results": []}]}
    assert f"\n# run\n\nThis model is a fine-tuned version of [{model_dir}](https://huggingface.co/{model_dir}) on " \
           "the docs_a and the docs_b datasets.\nIt achieves the following results on the evaluation set:\n" \
           f"- Loss: {eval_results['eval_loss']:.4f}\n" in body
    assert "- learning_rate: 0.001\n- train_batch_size: 4\n- eval_batch_size: 4\n- seed: 7\n" \
           "- gradient_accumulation_steps: 3\n- total_train_batch_size: 12\n" in body
    assert "- lr_scheduler_type: cosine\n- lr_scheduler_warmup_steps: 0.1\n- num_epochs: 2.0\n" in body
    table = body.split("### Training results\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split("|")[1:-1] == [" Training Loss ", " Epoch  ", " Step ", " Validation Loss "]
    assert len(table) == 2 + 7
    assert [float(row.split("|")[4]) for row in table[2:]] == [round(e["eval_loss"], 4) for e in evals]
    versions = body.split("### Framework versions\n\n")[1].splitlines()
    assert [v.split(" ")[:2] for v in versions] == [["-", "kiln"], ["-", "LibTorch"]]


def test_resume_from_a_checkpoint_with_the_model_folder_files(kiln_bin, full_run, fixture_dir, tmp_path):
    out, _ = full_run
    resumed = tmp_path / "run"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-8", resumed / "checkpoint-8")
    res = kiln_run(kiln_bin, fixture_dir, resumed, resume_from_checkpoint=str(resumed / "checkpoint-8"))
    assert res.returncode == 0, res.stderr[-3000:]
    whole = {(e["current_steps"], "loss" in e): e for e in map(json.loads, log_lines(out)[:-1])}
    again = [json.loads(line) for line in log_lines(resumed)]
    # This call's lines only (a fresh folder): steps 9-14 with the uninterrupted run's values.
    assert [e["current_steps"] for e in again if "loss" in e] == list(range(9, 15))
    for e in again[:-1]:
        ref = whole[(e["current_steps"], "loss" in e)]
        for key in ("loss", "eval_loss", "lr", "epoch"):
            assert e.get(key) == ref.get(key), (e, ref)
    assert files_of(resumed) == expected_files(LF_OUTPUT_FILES, KILN_OUTPUT_EXTRA)


def test_evaluation_follows_hf_rules(kiln_bin, fixture_dir, tmp_path):
    quick = {"num_train_epochs": None, "max_steps": 4, "save_steps": 0, "logging_steps": 2}
    # do_eval alone: no evaluation during training, one after it (eval_results.json only).
    out = tmp_path / "do_eval"
    res = kiln_run(kiln_bin, fixture_dir, out, **quick, eval_strategy=None, eval_steps=None)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not any("eval_loss" in line for line in log_lines(out))
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert not any("eval_loss" in h for h in history)
    assert set(json.loads((out / "eval_results.json").read_text())) == EVAL_RESULT_KEYS
    card = (out / "README.md").read_text()
    assert "- Loss: " in card and "### Training results\n\n\n\n### Framework versions" in card
    # Neither do_eval nor eval_strategy (LLaMA-Factory's defaults): val_size holds data out, and
    # nothing evaluates it.
    out = tmp_path / "no_eval"
    res = kiln_run(kiln_bin, fixture_dir, out, **quick, do_eval=None, eval_strategy=None, eval_steps=None)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (out / "eval_results.json").exists() and "eval_loss" not in (out / "trainer_log.jsonl").read_text()
    assert "It achieves" not in (out / "README.md").read_text()
    # eval_strategy: steps implies do_eval (TrainingArguments), and needs evaluation data.
    out = tmp_path / "no_data"
    res = kiln_run(kiln_bin, fixture_dir, out, **quick, val_size=None, do_eval=None)
    assert res.returncode != 0
    # LLaMA-Factory's check and words (hparams/parser.py:362-365), naming the key.
    assert "key 'eval_strategy': steps needs evaluation data" in res.stderr
    assert "Please make sure eval_dataset be provided or val_size >1e-6" in res.stderr
    assert len(res.stderr.strip().splitlines()[-1]) < 300


def test_byte_tokenizer_run_writes_what_it_can(run_kiln, tmp_path):
    # kiln's own config (the embedded corpus, the byte tokenizer): no tokenizer to save; the model,
    # its generation config (BOS/EOS of the byte tokenizer, pad = EOS) and the card are there.
    out = tmp_path / "byte"
    res = run_kiln("kiln-pretrain", "--device", "cpu", "--cutoff_len", "64", "--per_device_train_batch_size", "4",
                   "--logging_steps", "2", "--eval_steps", "2", "--val_size", "4", "--save_steps", "2",
                   "--max_steps", "4", "--output_dir", out)
    assert res.returncode == 0, res.stderr[-3000:]
    tokenizer_files = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert files_of(out) == expected_files(LF_OUTPUT_FILES - tokenizer_files, KILN_OUTPUT_EXTRA)
    assert files_of(out / "checkpoint-2") == expected_files(LF_CHECKPOINT_FILES - tokenizer_files,
                                                            KILN_CHECKPOINT_EXTRA)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"_from_model_config": True, "bos_token_id": 256, "eos_token_id": [257], "pad_token_id": 257}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.pad_token_id == 257 and model.generation_config.eos_token_id == [257]
    card = (out / "README.md").read_text()
    assert "base_model" not in card and "This model was trained from scratch on an unknown dataset." in card
    # kiln's own configs keep evaluating every eval_steps and at the end, into eval_results.json.
    assert [json.loads(line)["current_steps"] for line in log_lines(out) if "eval_loss" in line] == [2, 4]
    assert set(json.loads((out / "eval_results.json").read_text())) == EVAL_RESULT_KEYS


# ---- against the real LLaMA-Factory ----------------------------------------------------------

LF_PYTHON = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln")) / "venv-lf" / "bin" / "python"


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")
@pytest.mark.skipif(not LF_PYTHON.exists(), reason="no LLaMA-Factory reference venv: scripts/setup_lf_reference.sh")
def test_against_a_real_llamafactory_run(kiln_bin, tmp_path):
    script = ROOT / "tests" / "python" / "llamafactory_reference.py"
    fix = tmp_path / "fixture"
    made = subprocess.run([str(LF_PYTHON), str(script), "--make-fixture", str(fix)], capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    fixture = json.loads(made.stdout)
    lf_out, kiln_out = tmp_path / "lf" / "run", tmp_path / "kiln" / "run"
    kiln_out.parent.mkdir()
    kv = [f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in RUN_KEYS.items()
          if k not in ("stage", "do_train", "finetuning_type", "report_to", "dataset")]
    ref = subprocess.run([str(LF_PYTHON), str(script), "--train-run", str(lf_out), "--data", fixture["data"],
                          "--model", fixture["model"], *kv], capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    res = kiln_run(kiln_bin, fixture, kiln_out)
    assert res.returncode == 0, res.stderr[-3000:]

    # File lists: LLaMA-Factory's, its pickles replaced by kiln's files, plus kiln's own.
    assert files_of(lf_out) == LF_OUTPUT_FILES
    assert files_of(kiln_out) == expected_files(files_of(lf_out), KILN_OUTPUT_EXTRA)
    lf_ckpts = sorted(p.name for p in lf_out.iterdir() if p.is_dir())
    assert sorted(p.name for p in kiln_out.iterdir() if p.is_dir()) == lf_ckpts
    for name in lf_ckpts:
        assert files_of(kiln_out / name) == expected_files(files_of(lf_out / name), KILN_CHECKPOINT_EXTRA), name

    def load(folder, name):
        return json.loads((folder / name).read_text())

    for folder in ("", "checkpoint-14"):
        lf, kiln = lf_out / folder, kiln_out / folder
        for name in ("tokenizer.json", "chat_template.jinja"):
            assert (kiln / name).read_bytes() == (lf / name).read_bytes(), name
        assert load(kiln, "generation_config.json") == load(lf, "generation_config.json")
        # config.json: kiln writes transformers 4's spelling (torch_dtype, rope_theta), which both
        # read, and the model's use_cache; every other key and value as LLaMA-Factory's.
        lf_config, kiln_config = load(lf, "config.json"), load(kiln, "config.json")
        spelled = {"dtype", "rope_parameters", "transformers_version", "use_cache"}
        assert set(lf_config) - spelled == set(kiln_config) - {"torch_dtype", "rope_theta", "rope_scaling", "use_cache"}
        assert {k: v for k, v in lf_config.items() if k not in spelled} == \
               {k: kiln_config[k] for k in lf_config if k not in spelled}
        assert kiln_config["rope_theta"] == lf_config["rope_parameters"]["rope_theta"]
        # tokenizer_config.json: LLaMA-Factory's fix-up; transformers 5's load-time keys are not
        # copied, and the source's tokenizer_class is kept (TokenizersBackend is transformers 5's).
        lf_tok, kiln_tok = load(lf, "tokenizer_config.json"), load(kiln, "tokenizer_config.json")
        load_time = {"backend", "is_local", "local_files_only", "tokenizer_class"}
        assert {k: v for k, v in lf_tok.items() if k not in load_time} == \
               {k: v for k, v in kiln_tok.items() if k not in load_time}
        lf_state, kiln_state = load(lf, "trainer_state.json"), load(kiln, "trainer_state.json")
        assert set(lf_state) == set(kiln_state)
        assert len(lf_state["log_history"]) == len(kiln_state["log_history"])
        for a, b in zip(lf_state["log_history"], kiln_state["log_history"]):
            assert set(a) <= set(b), (a, b)

    for name, keys in (("train_results.json", TRAIN_RESULT_KEYS), ("eval_results.json", EVAL_RESULT_KEYS)):
        assert set(load(lf_out, name)) == set(load(kiln_out, name)) == keys
    assert set(load(lf_out, "all_results.json")) == set(load(kiln_out, "all_results.json"))
    assert load(kiln_out, "eval_results.json")["eval_loss"] == pytest.approx(
        load(lf_out, "eval_results.json")["eval_loss"], abs=1e-4)

    lf_lines, kiln_lines = log_lines(lf_out), log_lines(kiln_out)
    assert len(lf_lines) == len(kiln_lines)
    for a, b in zip(lf_lines, kiln_lines):
        lf_entry, kiln_entry = json.loads(a), check_log_line(b)
        assert list(lf_entry) == list(kiln_entry), (a, b)
        for key in ("current_steps", "total_steps", "percentage"):
            assert lf_entry[key] == kiln_entry[key]
        for key in ("loss", "eval_loss", "lr", "epoch"):
            if key in lf_entry:
                assert kiln_entry[key] == pytest.approx(lf_entry[key], abs=1e-4), (key, a, b)

    # README.md: the same card but for the framework versions (kiln's own) and num_epochs, which
    # kiln prints as the float it reads (LLaMA-Factory prints the YAML's own spelling).
    lf_card = (lf_out / "README.md").read_text().split("### Framework versions")[0]
    kiln_card = (kiln_out / "README.md").read_text().split("### Framework versions")[0]
    lf_rows, kiln_rows = lf_card.splitlines(), kiln_card.splitlines()
    assert len(lf_rows) == len(kiln_rows)
    for a, b in zip(lf_rows, kiln_rows):
        if a.startswith("- num_epochs: "):
            assert float(a.split(": ")[1]) == float(b.split(": ")[1])
        elif a.startswith("| ") and a[2:3].isdigit():
            cells_a, cells_b = a.split("|")[1:-1], b.split("|")[1:-1]
            assert [float(x) for x in cells_a] == pytest.approx([float(x) for x in cells_b], abs=2e-4), (a, b)
        elif a.startswith("- Loss: "):
            assert float(a[8:]) == pytest.approx(float(b[8:]), abs=2e-4)
        else:
            assert a == b
