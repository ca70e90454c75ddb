"""Coming from LLaMA-Factory (issue 15, points 1-2): its pretraining YAML runs unchanged with
kiln-pretrain --config (only the model line names a small kiln preset), datasets are found by name
through a local dataset_info.json (a .json array file and a .jsonl file with another text column),
tokenized once into a cache and reused.

References: LLaMA-Factory's pretraining preprocessing (each document's text + EOS, no BOS, the
datasets concatenated in order); the same files tokenized by hand with kiln-tokenize, and the byte
tokenizer's definition (ids = UTF-8 bytes, EOS 257), computed here in Python.
"""
import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np

# LLaMA-Factory's pretraining example as issue 15 gives it (the C++ config test reads it too).
ISSUE_YAML = (Path(__file__).resolve().parents[1] / "data" / "fixtures" / "lf_pretrain_issue15.yaml").read_text()
EOS = 257  # the byte tokenizer's
# Later runs only need to reach the data: one short fp32 step, no evaluation.
QUICK = ("--max_steps", "1", "--gradient_accumulation_steps", "1", "--cutoff_len", "256", "--bf16", "false",
         "--val_size", "0", "--eval_strategy", "no")  # no evaluation data: HF refuses eval_strategy steps


def document_maker(seed: int, words: str):
    """doc() -> a document of 20-120 words drawn from `words`, the same sequence for a seed."""
    rng = random.Random(seed)
    vocabulary = words.split()
    return lambda: " ".join(rng.choice(vocabulary) for _ in range(rng.randint(20, 120)))


def make_project(root: Path):
    doc = document_maker(15, "the a cat dog sat ran on under big small red house tree river quickly slowly é 字")

    data = root / "data"
    data.mkdir(parents=True)
    arr = [{"text": doc(), "id": i} for i in range(120)]
    (data / "c4_part.json").write_text(json.dumps(arr, ensure_ascii=False))
    lines = [{"content": doc(), "meta": {"n": i}} for i in range(80)]
    (data / "more.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    (data / "dataset_info.json").write_text(json.dumps({
        "c4_demo": {"file_name": "c4_part.json", "columns": {"prompt": "text"}},
        "more_demo": {"file_name": "more.jsonl", "columns": {"prompt": "content"}},
        "c4_hub": {"hf_hub_url": "allenai/c4"},
    }))
    yaml = ISSUE_YAML.replace("model_name_or_path: path/to/hf-dir", "model: tiny")
    yaml = yaml.replace("dataset: c4_demo", "dataset: c4_demo,more_demo")
    (root / "pretrain.yaml").write_text(yaml)
    return [x["text"] for x in arr] + [x["content"] for x in lines]


def pretrain(kiln_bin, root, *args, timeout=120):
    env = dict(os.environ, KILN_HOME=str(root / "home"))
    return subprocess.run([str(kiln_bin("kiln-pretrain")), "--config", "pretrain.yaml", "--device", "cpu", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def train_tokens(shard_dir: Path):
    meta = json.loads((shard_dir / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    return np.concatenate([np.fromfile(shard_dir / s["file"], dtype=dtype)
                           for s in meta["splits"]["train"]["shards"]]).astype(np.int64)


def tokenized_by_hand(kiln_bin, root: Path, files):
    """Each (file under root/data, text key) tokenized alone with kiln-tokenize, concatenated."""
    by_hand = []
    for name, key in files:
        out = root / f"by-hand-{name}"
        tok = subprocess.run([str(kiln_bin("kiln-tokenize")), "--tokenizer", "byte", "--input",
                              str(root / "data" / name), "--output", str(out), "--text-key", key],
                             capture_output=True, text=True, timeout=60)
        assert tok.returncode == 0, tok.stderr
        by_hand.append(train_tokens(out))
    return np.concatenate(by_hand)


def cache_dirs(root: Path):
    return sorted((root / "home" / "data" / "datasets").glob("c4_demo+more_demo-*"))


def test_the_issue_yaml_runs_unchanged_and_the_tokens_are_the_files(kiln_bin, tmp_path):
    docs = make_project(tmp_path)
    # The YAML as written; the command line only bounds the run (bf16 on a CPU is slow).
    # The YAML's preprocessing_num_workers: 16 packs each of 16 contiguous shards on its own (as
    # LLaMA-Factory does): the 20 eval documents here are too short to fill a 2048-token block in
    # any shard, which LLaMA-Factory refuses too. One worker packs them together.
    res = pretrain(kiln_bin, tmp_path, "--max_steps", "1", "--gradient_accumulation_steps", "1",
                   "--preprocessing_num_workers", "1")
    assert res.returncode == 0, res.stderr
    err = res.stderr.splitlines()
    # One info line for each key that cannot change a kiln run; none for the ones it acts on.
    for key in ("trust_remote_code",):
        assert sum(line.startswith(f"pretrain.yaml: {key}:") for line in err) == 1, (key, res.stderr)
    for key in ("plot_loss", "report_to"):
        assert not any(line.startswith(f"pretrain.yaml: {key}:") for line in err), (key, res.stderr)
    # plot_loss and report_to: tensorboard wrote LLaMA-Factory's figures and the event file
    # (tests/python/test_run_outputs.py reads them).
    out_dir = tmp_path / "saves" / "llama3-1b" / "full" / "pretrain"
    assert (out_dir / "training_loss.png").is_file() and (out_dir / "training_eval_loss.png").is_file()
    assert len(list((out_dir / "runs").glob("*/events.out.tfevents.*"))) == 1
    assert sum("c4_demo+more_demo: tokenized 200 documents" in line for line in err) == 1, res.stderr
    assert "examples of held-out documents" in res.stdout  # the banner
    assert "finished at step 1" in res.stdout + res.stderr
    (cache,) = cache_dirs(tmp_path)

    # The same tokens as the definition (UTF-8 bytes + EOS per document, in order) ...
    expected = [t for d in docs for t in [*d.encode("utf-8"), EOS]]
    got = train_tokens(cache)
    assert got.tolist() == expected
    # ... and as each file tokenized by hand with kiln-tokenize, concatenated.
    assert np.array_equal(tokenized_by_hand(kiln_bin, tmp_path, (("c4_part.json", "text"), ("more.jsonl", "content"))),
                          got)

    # A second run reuses the cache (no tokenization: the shards are not rewritten) ...
    stamp = (cache / "meta.json").stat().st_mtime_ns
    res = pretrain(kiln_bin, tmp_path, *QUICK, "--overwrite_cache", "false")
    assert res.returncode == 0, res.stderr
    assert "reusing the tokenized shards" in res.stderr and " tokenized 200 documents" not in res.stderr
    assert (cache / "meta.json").stat().st_mtime_ns == stamp
    # ... unless overwrite_cache: true (the YAML's own setting).
    res = pretrain(kiln_bin, tmp_path, *QUICK)
    assert res.returncode == 0, res.stderr
    assert "tokenized 200 documents" in res.stderr
    assert cache_dirs(tmp_path) == [cache]
    assert train_tokens(cache).tolist() == expected
    # max_samples applies per dataset (the first N of each: 100 of 120, 80 of 80).
    res = pretrain(kiln_bin, tmp_path, *QUICK, "--max_samples", "100")
    assert res.returncode == 0, res.stderr
    assert "tokenized 180 documents" in res.stderr


def test_refused_keys_and_hub_datasets_are_one_clear_line(kiln_bin, tmp_path):
    make_project(tmp_path)
    cases = [
        (("--stage", "sft"), ["'stage'", "'sft'", "stage: pt"]),
        (("--finetuning_type", "lora"), ["'finetuning_type'", "'lora'", "finetuning_type: full"]),
        (("--dataset", "c4_hub"), ["'dataset'", "c4_hub", "hf_hub_url", "allenai/c4", "download"]),
        (("--dataset", "c4_demo,nope"), ["'nope'", "not defined", "dataset_info.json"]),
        (("--trust_remote_cod", "true"), ["'trust_remote_cod'", "unknown key"]),
    ]
    for args, needles in cases:
        res = pretrain(kiln_bin, tmp_path, *QUICK, *args, timeout=60)
        assert res.returncode != 0, args
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        assert len(errors) == 1, (args, res.stderr)
        for needle in needles:
            assert needle in errors[0], (args, needle, errors[0])


def test_jsonl_gz_reads_as_the_plain_file(kiln_bin, tmp_path):
    import gzip
    lines = "".join(json.dumps({"text": f"doc {i} é"}) + "\n" for i in range(50))
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(lines)
    outs = []
    for name in ("a.jsonl", "a.jsonl.gz"):
        out = tmp_path / f"out-{name}"
        res = subprocess.run([str(kiln_bin("kiln-tokenize")), "--tokenizer", "byte", "--input", str(tmp_path / name),
                              "--output", str(out)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        outs.append(train_tokens(out))
    assert np.array_equal(outs[0], outs[1])
    # A file cut short (as by an interrupted download) is an error naming it, not a shorter corpus
    # (zlib hands out what it could decompress, then reports the cut).
    raw = (tmp_path / "a.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(raw[:len(raw) - 12])  # the 8-byte trailer and 4 more
    res = subprocess.run([str(kiln_bin("kiln-tokenize")), "--tokenizer", "byte", "--input",
                          str(tmp_path / "cut.jsonl.gz"), "--output", str(tmp_path / "cut")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "cut.jsonl.gz" in res.stderr and "truncated" in res.stderr, res.stderr


# --- The corpora people pretrain on (issue 15, point 3): .json, .jsonl.zst and .parquet ---------
# References: the texts this test writes (pyarrow writes the Parquet files, zstandard the zstd
# frames), the byte tokenizer's definition, and each file tokenized by hand with kiln-tokenize.

def parquet_supported(kiln_bin):
    res = subprocess.run([str(kiln_bin("kiln-tokenize")), "--help"], capture_output=True, text=True, timeout=60)
    return "NOT in this build" not in res.stdout


def make_corpus_project(root: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    doc = document_maker(3, "the a cat dog sat ran on under big small red house tree river é 字 😀")

    data = root / "data"
    (data / "pq").mkdir(parents=True)
    arr = [{"text": doc(), "id": i} for i in range(60)]
    (data / "c4_part.json").write_text(json.dumps(arr, ensure_ascii=False))
    web = [doc() for _ in range(40)]
    lines = "".join(json.dumps({"content": d, "url": f"u{i}"}, ensure_ascii=False) + "\n" for i, d in enumerate(web))
    raw = lines.encode()
    half = len(raw) // 2 + 1  # two frames, split inside a line (and maybe inside a character)
    c = zstandard.ZstdCompressor(level=3)
    (data / "web.jsonl.zst").write_bytes(c.compress(raw[:half]) + c.compress(raw[half:]))
    parts = [[doc() for _ in range(30)], [doc() for _ in range(25)]]
    parts[0][7] = None  # a null text: LLaMA-Factory makes it "" + EOS
    for i, (texts, kind) in enumerate(zip(parts, (pa.string(), pa.large_string()))):
        table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": pa.array(texts, kind)})
        pq.write_table(table, data / "pq" / f"part-{i}.parquet", row_group_size=8)
    (data / "dataset_info.json").write_text(json.dumps({
        "c4_demo": {"file_name": "c4_part.json", "columns": {"prompt": "text"}},
        "web_zst": {"file_name": "web.jsonl.zst", "columns": {"prompt": "content"}},
        "pq_demo": {"file_name": "pq", "columns": {"prompt": "text"}},  # a folder of .parquet files
    }))
    yaml = ISSUE_YAML.replace("model_name_or_path: path/to/hf-dir", "model: tiny")
    (root / "pretrain.yaml").write_text(yaml.replace("dataset: c4_demo", "dataset: c4_demo,web_zst,pq_demo"))
    return [x["text"] for x in arr] + web + parts[0] + parts[1]


def test_the_issue_yaml_reads_json_zst_and_parquet_and_reuses_the_cache(kiln_bin, tmp_path):
    if not parquet_supported(kiln_bin):
        import pytest
        pytest.skip("kiln built without Parquet (kiln-tokenize --help says why)")
    docs = make_corpus_project(tmp_path)
    res = pretrain(kiln_bin, tmp_path, "--max_steps", "2", "--gradient_accumulation_steps", "1",
                   "--preprocessing_num_workers", "1")  # as in the test above
    assert res.returncode == 0, res.stderr
    assert sum("c4_demo+web_zst+pq_demo: tokenized 155 documents" in line for line in res.stderr.splitlines()) == 1
    assert "1 null texts read as empty documents" in res.stderr
    assert "finished at step 2" in res.stdout + res.stderr
    (cache,) = sorted((tmp_path / "home" / "data" / "datasets").glob("c4_demo+web_zst+pq_demo-*"))

    expected = [t for d in docs for t in [*(d or "").encode("utf-8"), EOS]]
    got = train_tokens(cache)
    assert got.tolist() == expected
    files = (("c4_part.json", "text"), ("web.jsonl.zst", "content"), ("pq", "text"))
    assert np.array_equal(tokenized_by_hand(kiln_bin, tmp_path, files), got)

    # The second run reuses the cache: no tokenization line, no shard file rewritten.
    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    res = pretrain(kiln_bin, tmp_path, *QUICK, "--overwrite_cache", "false")
    assert res.returncode == 0, res.stderr
    assert "reusing the tokenized shards" in res.stderr and "tokenized 155" not in res.stderr
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    # overwrite_cache: true (the YAML's) tokenizes again, into the same folder, the same tokens.
    res = pretrain(kiln_bin, tmp_path, *QUICK)
    assert res.returncode == 0, res.stderr
    assert "tokenized 155 documents" in res.stderr
    assert (cache / "meta.json").stat().st_mtime_ns != stamps["meta.json"]
    assert train_tokens(cache).tolist() == expected
    # max_samples counts rows per dataset, the null row included (the first 10 of each: 30).
    res = pretrain(kiln_bin, tmp_path, *QUICK, "--max_samples", "10", "--cutoff_len", "64")
    assert res.returncode == 0, res.stderr
    assert "tokenized 30 documents" in res.stderr and "1 null texts" in res.stderr
