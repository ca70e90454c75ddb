"""kiln-generate against transformers' generate (the independent reference) on the same model and
tokenizer.json: the prompt is encoded as HF's tokenizer(prompt) encodes it (with the template's
BOS where the tokenizer.json has one, without where it has none), and greedy continuations are
token for token equal. Also the rules for kiln's own runs: a checkpoint trained on kiln shards
(no BOS) is prompted without BOS, the flags override, ids outside the tokenizer are never
sampled, and a negative --max-new-tokens is an error. kiln-eval starts its blocks by the same BOS
rule."""
import json
import subprocess
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import (  # noqa: E402
    Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers)

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PROMPT = "The quick brown fox, it's said, jumps"


def make_tokenizer(with_bos_template: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [json.loads(line)["text"] for line in (ROOT / "data/corpus/stories.jsonl").open()][:500]
    tok.train_from_iterator(texts, trainer)
    if with_bos_template:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def make_model(path: Path, vocab: int, bos: int, eos: int):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=bos, eos_token_id=eos, initializer_range=0.2)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


def kiln_ids(run_kiln, *args):
    out = run_kiln("kiln-generate", *args, "--greedy", "--ids", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("with_bos_template", [True, False])
def test_greedy_continuation_equals_transformers(tmp_path, run_kiln, with_bos_template):
    tok = make_tokenizer(with_bos_template)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    model_dir = tmp_path / "model"
    model = make_model(model_dir, vocab, bos, eos)
    tok.save(str(model_dir / "tokenizer.json"))

    hf_prompt = tok.encode(PROMPT).ids  # HF's tokenizer(prompt): add_special_tokens=True
    assert (hf_prompt[0] == bos) == with_bos_template
    with torch.no_grad():
        hf = model.generate(torch.tensor([hf_prompt]), max_new_tokens=24, do_sample=False, eos_token_id=eos,
                            pad_token_id=eos)[0, len(hf_prompt):].tolist()
    got = kiln_ids(run_kiln, "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "24")
    assert got["prompt"] == hf_prompt
    assert got["generated"] == hf
    # --no-add-bos / --add-bos override the template either way.
    plain = tok.encode(PROMPT, add_special_tokens=False).ids
    assert kiln_ids(run_kiln, "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "0",
                    "--no-add-bos")["prompt"] == plain
    assert kiln_ids(run_kiln, "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "0",
                    "--add-bos")["prompt"] == [bos] + plain


def test_sentencepiece_tokenizer_continuation_and_text_equal_transformers(tmp_path, run_kiln):
    # A Llama-2-layout tokenizer (Prepend/Replace normalizer, byte fallback, BOS template, the
    # Replace/ByteFallback/Fuse/Strip decoder). kiln-generate prints the prompt, then the new
    # tokens' text as transformers' text-generation pipeline cuts it: decode(prompt + new) less
    # decode(prompt). decode(new) alone would lose the space Strip takes off a sequence's start.
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
                                  show_progress=False)
    texts = [json.loads(line)["text"] for line in (ROOT / "data/corpus/stories.jsonl").open()][:500]
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    model_dir = tmp_path / "model"
    model = make_model(model_dir, tok.get_vocab_size(), 1, 2)
    tok.save(str(model_dir / "tokenizer.json"))

    hf_prompt = tok.encode(PROMPT).ids
    assert hf_prompt[0] == 1
    with torch.no_grad():
        hf = model.generate(torch.tensor([hf_prompt]), max_new_tokens=24, do_sample=False, eos_token_id=2,
                            pad_token_id=2)[0, len(hf_prompt):].tolist()
    got = kiln_ids(run_kiln, "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "24")
    assert got["prompt"] == hf_prompt
    assert got["generated"] == hf
    res = run_kiln("kiln-generate", "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "24", "--greedy",
                   "--device", "cpu")
    assert res.returncode == 0, res.stderr
    full = tok.decode(hf_prompt + hf, skip_special_tokens=True)
    head = tok.decode(hf_prompt, skip_special_tokens=True)
    assert full.startswith(head)
    assert res.stdout == PROMPT + full[len(head):] + "\n"
    assert tok.decode(hf) != full[len(head):]  # this continuation starts with "▁": the cut matters


def test_kiln_trained_checkpoint_is_prompted_as_its_shards(run_kiln, kiln_bin, tmp_path):
    out_dir = tmp_path / "run"
    res = run_kiln("kiln-pretrain", "--max_steps", "2", "--logging_steps", "1", "--eval_steps", "0", "--save_steps",
                   "0", "--output_dir", out_dir)
    assert res.returncode == 0, res.stderr
    ckpt = out_dir / "checkpoint-2"
    record = json.loads((ckpt / "kiln_data.json").read_text())
    assert record["tokenizer"]["name"] == "byte" and record["tokenizer"]["add_special_tokens"] is False
    prompt = list(b"The ")
    assert kiln_ids(run_kiln, "--model", ckpt, "--prompt", "The ", "--max-new-tokens", "0")["prompt"] == prompt
    assert kiln_ids(run_kiln, "--model", ckpt, "--prompt", "The ", "--max-new-tokens", "0",
                    "--add-bos")["prompt"] == [256] + prompt
    # The tiny model has 320 rows for the byte tokenizer's 259 ids: sampling stays below 259, and
    # the text always decodes.
    for seed in range(3):
        res = run_kiln("kiln-generate", "--model", ckpt, "--prompt", "The ", "--max-new-tokens", "64",
                       "--temperature", "5", "--top-k", "0", "--top-p", "1", "--seed", str(seed), "--ids")
        assert res.returncode == 0, res.stderr
        assert max(json.loads(res.stdout)["generated"]) < 259
        raw = subprocess.run([str(kiln_bin("kiln-generate")), "--model", str(ckpt), "--prompt", "The ",
                              "--max-new-tokens", "64", "--temperature", "5", "--top-k", "0", "--top-p", "1",
                              "--seed", str(seed)], capture_output=True, timeout=120)
        assert raw.returncode == 0, raw.stderr  # bytes: a byte model's text need not be valid UTF-8
    # kiln-eval on its own training shards: the blocks as trained (no BOS) unless asked.
    data_dir = run_kiln("kiln-tokenize", "--default-corpus").stdout.strip()
    as_trained, _ = eval_report(run_kiln, "--model", ckpt, "--dataset-dir", data_dir, "--cutoff-len", "64")
    assert "after BOS" not in as_trained and "kiln_data.json" in as_trained, as_trained
    with_bos, _ = eval_report(run_kiln, "--model", ckpt, "--dataset-dir", data_dir, "--cutoff-len", "64", "--add-bos")
    assert "after BOS 256" in with_bos, with_bos
    res = run_kiln("kiln-generate", "--model", ckpt, "--prompt", "The ", "--max-new-tokens", "-1")
    assert res.returncode == 2 and "key 'max_new_tokens'" in res.stderr and "-1" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_shards_of_a_larger_tokenizer_are_one_clear_line_in_every_program(run_kiln, tmp_path):
    # A tokenizer of 400 ids, shards made with it, and models of 320 rows (the tiny preset, and an
    # HF directory): each program refuses before running, naming the id and the vocab_size.
    tok = make_tokenizer(True)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "text.txt").write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 400))
    shards = tmp_path / "shards"
    res = run_kiln("kiln-tokenize", "--tokenizer", tmp_path / "tokenizer.json", "--input", tmp_path / "text.txt",
                   "--output", shards, "--val-fraction", "0.5")
    assert res.returncode == 0, res.stderr
    model_dir = tmp_path / "model"
    make_model(model_dir, 320, 1, 2)
    runs = {
        "kiln-pretrain": ["--dataset_dir", shards, "--cutoff_len", "16", "--max_steps", "1", "--output_dir",
                          tmp_path / "out"],
        "kiln-eval": ["--model", model_dir, "--dataset-dir", shards, "--cutoff-len", "16"],
    }
    for program, args in runs.items():
        res = run_kiln(program, *args)
        assert res.returncode == 2, (program, res.stdout)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, (program, res.stderr)
        assert "token id 3" in lines[0] and "vocab_size" in lines[0] and "320" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    # kiln-generate: a prompt the 400-id tokenizer encodes with an id the 320-row model lacks.
    text = [json.loads(line)["text"] for line in (ROOT / "data/corpus/stories.jsonl").open()][0][:300]
    ids = tok.encode(text).ids
    first_bad = next(i for i in ids if i >= 320)
    res = run_kiln("kiln-generate", "--model", model_dir, "--tokenizer", tmp_path / "tokenizer.json", "--prompt", text,
                   "--max-new-tokens", "4", "--device", "cpu")
    assert res.returncode == 2, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"token id {first_bad} " in lines[0] and "vocab_size 320" in lines[0], lines[0]


def eval_report(run_kiln, *args):
    res = run_kiln("kiln-eval", *args, "--device", "cpu")
    assert res.returncode == 0, res.stderr
    head, loss, _ = res.stdout.strip().splitlines()
    return head, float(loss.split()[1])


def test_kiln_eval_starts_blocks_by_the_bos_rule(run_kiln, tmp_path):
    # An HF model with a BOS-template tokenizer.json, scored on shards made without the template:
    # as HF's tokenizer(text) starts each sequence, every block gets the BOS (and every block token
    # is then a target); --no-add-bos scores the blocks as they are (one target fewer per block).
    tok = make_tokenizer(True)
    bos = tok.token_to_id("<|begin_of_text|>")
    model_dir = tmp_path / "model"
    make_model(model_dir, tok.get_vocab_size(), bos, tok.token_to_id("<|end_of_text|>"))
    tok.save(str(model_dir / "tokenizer.json"))
    texts = [json.loads(line)["text"] for line in (ROOT / "data/corpus/stories.jsonl").open()][:40]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    shards = tmp_path / "shards"
    res = run_kiln("kiln-tokenize", "--tokenizer", model_dir / "tokenizer.json", "--input", tmp_path / "text.jsonl",
                   "--output", shards)
    assert res.returncode == 0, res.stderr
    common = ["--model", model_dir, "--dataset-dir", shards, "--cutoff-len", "32", "--batch-size", "4"]
    auto_head, auto_loss = eval_report(run_kiln, *common)
    assert f"after BOS {bos}" in auto_head and "template" in auto_head, auto_head
    blocks = int(auto_head.split(": ")[1].split()[0].replace(",", ""))
    assert f"{blocks * 32:,} target tokens" in auto_head
    add_head, add_loss = eval_report(run_kiln, *common, "--add-bos")
    assert add_loss == auto_loss
    none_head, none_loss = eval_report(run_kiln, *common, "--no-add-bos")
    assert "after BOS" not in none_head and f"{blocks * 31:,} target tokens" in none_head
    assert none_loss != auto_loss
    # The same model without a template in its tokenizer.json: no BOS.
    tok.post_processor = None
    tok.save(str(model_dir / "tokenizer.json"))
    plain_head, plain_loss = eval_report(run_kiln, *common)
    assert "after BOS" not in plain_head and plain_loss == none_loss
    # --add-bos and --no-add-bos are one key, add_bos: given twice, the last wins (config/key_table.h).
    assert eval_report(run_kiln, *common, "--add-bos", "--no-add-bos") == eval_report(run_kiln, *common, "--no-add-bos")
    assert eval_report(run_kiln, *common, "--no-add-bos", "--add-bos") == eval_report(run_kiln, *common, "--add-bos")
    res = run_kiln("kiln-eval", *common, "--add-bos", "sometimes")
    assert res.returncode == 2 and "key 'add_bos'" in res.stderr and len(res.stderr.strip().splitlines()) == 1
