"""train_from_scratch (issue 53, item 5): a config folder (config.json + tokenizer files, no weights)
trains from a random init with its own tokenizer, as LLaMA-Factory 0.9.5's
AutoModelForCausalLM.from_config (model/loader.py:169-170).

The folder is LLaMA-Factory's fixture model (tests/python/fixtures/lf_parity/model: a byte-level
BPE of 384 tokens, hidden 16, one layer) less its model.safetensors. References:
- the loss of a random init: every logit is a dot product of the final RMSNorm's output (rms 1,
  so norm sqrt(hidden) = 4) with an lm_head row drawn from N(0, 0.02), i.e. about N(0, 0.08^2),
  so each target's cross-entropy is ln(vocab) + O(0.08^2) and its mean over the ~500 targets of
  step 1 is ln(384) within about 0.01 (transformers' own from_config on this data over seeds 0-5:
  5.945 to 5.960). The logged loss is transformers 5.6's, normalised by num_items_in_batch, which
  also counts the first label of each row, never a target: ln(384) x 63/64 at cutoff_len 64
  (LLaMA-Factory's own run of this YAML logs 5.8500 at step 1). Tolerance 0.03: three times the
  spread of a random init, an order of magnitude below what 4 steps of training move;
- transformers loads output_dir (LlamaForCausalLM.from_pretrained) and its logits equal kiln's
  forward of the saved weights (kiln-hf forward) within 1e-4; the tokenizer saved is the folder's;
- what LLaMA-Factory's run leaves that depends on the mode: generation_config.json made from the
  model config (from_config never reads the folder's), config.json's special tokens aligned with
  the tokenizer; the model card says "trained from scratch" (LLaMA-Factory's would name the config
  folder as base_model: kiln claims no weights it did not load, docs/llamafactory.md);
- without train_from_scratch the same folder is refused before any data is read, naming the
  missing model.safetensors and train_from_scratch.
The init's statistics (std = initializer_range per tensor) and the resume are C++ tests
(tests/train/test_trainer.cpp, "train_from_scratch: ...").
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

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lf_parity"
VOCAB = 384
CUTOFF = 64


@pytest.fixture(scope="module")
def config_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scratch") / "config_only"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / "model" / name, folder / name)
    # A generation_config.json that from_config would not read: it must not reach output_dir.
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1,
                                                               "do_sample": True, "temperature": 0.7}))
    return folder


def pretrain(kiln_bin, folder: Path, out: Path, **keys):
    config = {"stage": "pt", "do_train": True, "finetuning_type": "full", "model_name_or_path": str(folder),
              "train_from_scratch": True, "dataset": "docs_a,docs_b", "dataset_dir": str(FIXTURE / "data"),
              "cutoff_len": CUTOFF, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
              "max_steps": 4, "logging_steps": 1, "save_steps": 100, "learning_rate": 1.0e-2,
              "lr_scheduler_type": "constant", "report_to": "none", "seed": 42, "output_dir": str(out),
              "device": "cpu"}
    config.update(keys)
    config = {k: v for k, v in config.items() if v is not None}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, KILN_HOME=str(out.parent / "kiln-home"))
    return subprocess.run([str(kiln_bin("kiln-pretrain")), "--config", str(path)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=out.parent)


@pytest.fixture(scope="module")
def scratch_run(kiln_bin, config_folder):
    out = config_folder.parent / "run"
    res = pretrain(kiln_bin, config_folder, out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res


def test_the_banner_says_the_model_is_initialised_from_config_json(scratch_run, config_folder):
    _, res = scratch_run
    assert f"initialised at random from {config_folder / 'config.json'}" in res.stdout
    assert f"tokenizer {config_folder / 'tokenizer.json'}" in res.stdout


def test_step_one_loss_is_a_random_inits(scratch_run):
    out, _ = scratch_run
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert len(losses) == 4
    expected = math.log(VOCAB) * (CUTOFF - 1) / CUTOFF
    assert abs(losses[0] - expected) < 0.03, (losses[0], expected)
    assert losses[-1] < losses[0] - 0.1, losses  # and it trains


def test_transformers_loads_the_model_and_gives_kilns_logits(scratch_run, config_folder, run_kiln, tmp_path):
    out, _ = scratch_run
    assert not (config_folder / "model.safetensors").exists()
    assert (out / "tokenizer.json").read_bytes() == (config_folder / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = torch.tensor([tok("the city was kiln llama token packing").input_ids * 3])
    model = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    source = json.loads((config_folder / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "initializer_range", "tie_word_embeddings"):
        assert getattr(model.config, key) == source[key], key
    # transformers' align_special_tokens with LLaMA-Factory's pad = eos, as its from-scratch run saves.
    assert (model.config.eos_token_id, model.config.pad_token_id) == (1, 1)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["_from_model_config"] is True and "temperature" not in generation
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    batch = tmp_path / "batch.safetensors"
    save_file({"input_ids": ids, "labels": ids.clone()}, str(batch))
    res = run_kiln("kiln-hf", "forward", "--model", out, "--batch", batch, "--out", tmp_path / "out.safetensors")
    assert res.returncode == 0, res.stderr
    kiln = load_file(str(tmp_path / "out.safetensors"))["logits"]
    diff = (kiln.double() - logits.double()).abs().max().item()
    assert diff < 1e-4, diff


def test_the_model_card_claims_no_base_model(scratch_run, config_folder):
    out, _ = scratch_run
    card = (out / "README.md").read_text()
    assert "This model was trained from scratch on the docs_a and the docs_b datasets." in card
    assert "base_model" not in card and str(config_folder) not in card
    assert json.loads((out / "training_args.json").read_text())["train_from_scratch"] is True


def test_without_train_from_scratch_the_missing_weights_are_named(kiln_bin, config_folder):
    out = config_folder.parent / "refused"
    res = pretrain(kiln_bin, config_folder, out, train_from_scratch=None)
    assert res.returncode == 2
    assert str(config_folder / "model.safetensors") in res.stderr
    assert "train_from_scratch: true" in res.stderr
    assert not out.exists()  # refused before the output folder is made


# Llama 3's tokenizer as its tokenizer.json defines it (the split regex, byte-level BPE with
# ignore_merges, <|begin_of_text|> from the post-processor, EOS <|end_of_text|>, no pad, the chat
# tokens <|eot_id|> and <|eom_id|>), trained small on the fixture's documents: the real file is not
# available offline. The config is Llama-3.2-1B's architecture (GQA, rope_theta 500000, tied
# embeddings) at a tiny size.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def llama3_config_folder(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers

    folder = tmp_path_factory.mktemp("scratch_llama3") / "llama3_config"
    folder.mkdir()
    docs = [json.loads(line)["text"] for line in (FIXTURE / "data" / "docs_b.jsonl").read_text().splitlines()]
    docs += [d["text"] for d in json.loads((FIXTURE / "data" / "docs_a.json").read_text())]
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"]
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>", "model_max_length": 131072, "clean_up_tokenization_spaces": True}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": tok.get_vocab_size(),
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": bos, "eos_token_id": tok.token_to_id("<|end_of_text|>"), "attention_bias": False,
        "mlp_bias": False, "torch_dtype": "bfloat16"}))
    return folder, tok


def test_a_llama3_tokenizer_model_trains_from_a_config_folder(kiln_bin, llama3_config_folder, run_kiln, tmp_path):
    # template: llama3 as a Llama 3 pretraining YAML writes it: documents end in <|end_of_text|>
    # (scored), <|eot_id|> is EOS and pad (masked); the model starts at a random init.
    folder, tok = llama3_config_folder
    out = folder.parent / "run"
    res = pretrain(kiln_bin, folder, out, template="llama3", cutoff_len=128, max_steps=6)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"initialised at random from {folder / 'config.json'}" in res.stdout
    assert "template llama3: EOS replaced by <|eot_id|>" in res.stdout + res.stderr
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in log if "loss" in e]
    assert len(losses) == 6
    vocab = tok.get_vocab_size()
    # A random init's loss is about ln(vocab) (see the module's note; the rows' first labels and
    # the tied embedding move it by less than 0.1 here), and it trains.
    assert abs(losses[0] - math.log(vocab)) < 0.1, (losses[0], math.log(vocab))
    assert losses[-1] < losses[0] - 0.1, losses
    # Documents end in <|end_of_text|> (the tokenizer's own EOS, so the shards need no other
    # separator), which is scored; the pad the collator masks is <|eot_id|>.
    end, eot = tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")
    assert f"each document ends with id {end} (scored); labels -100 at the pad id {eot}" in res.stdout + res.stderr
    shards = next((out.parent / "kiln-home" / "data" / "datasets").iterdir())
    assert "separator_id" not in json.loads((shards / "kiln_dataset.json").read_text())
    # transformers loads what kiln saved and computes the same logits.
    model = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    ids = torch.tensor([tok.encode("the city was kiln llama token packing").ids * 2])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    batch = tmp_path / "batch.safetensors"
    save_file({"input_ids": ids, "labels": ids.clone()}, str(batch))
    res = run_kiln("kiln-hf", "forward", "--model", out, "--batch", batch, "--out", tmp_path / "out.safetensors")
    assert res.returncode == 0, res.stderr
    diff = (load_file(str(tmp_path / "out.safetensors"))["logits"].double() - logits.double()).abs().max().item()
    assert diff < 1e-4, diff
