"""kiln-tokenize as a program: malformed JSONL lines are named with file and line (fatal with exit
code 2 and no shard set left behind, or skipped on request), an existing shard set is not
overwritten silently, and the embedded default corpus builds into shards whose tokens are the
corpus's own bytes (reference: the byte tokenizer's definition, id = byte, EOS = 257)."""
import json

import numpy as np


def test_bad_jsonl_lines(tmp_path, run_kiln):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine"}\n{"text": broken\n{"text": "also fine"}\n')
    out = tmp_path / "out"
    res = run_kiln("kiln-tokenize", "--input", src, "--output", out)
    assert res.returncode == 2
    assert f"{src}:2" in res.stderr and "--skip-bad-lines" in res.stderr
    assert not (out / "meta.json").exists()
    res = run_kiln("kiln-tokenize", "--input", src, "--output", out, "--skip-bad-lines")
    assert res.returncode == 0, res.stderr
    assert f"{src}:2" in res.stderr and "1 malformed lines skipped" in res.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] == 2
    res = run_kiln("kiln-tokenize", "--input", src, "--output", out, "--skip-bad-lines")
    assert res.returncode == 2 and "--overwrite" in res.stderr
    res = run_kiln("kiln-tokenize", "--input", tmp_path / "missing.jsonl", "--output", out)
    assert res.returncode == 2 and "missing.jsonl" in res.stderr
    res = run_kiln("kiln-tokenize", "--input", src, "--output", out, "--val-fraction", "1.5")
    assert res.returncode == 2 and "key 'val_fraction'" in res.stderr


def test_default_corpus_shards(tmp_path, run_kiln):
    res = run_kiln("kiln-tokenize", "--default-corpus", "--output", tmp_path)
    assert res.returncode == 0, res.stderr
    folder = tmp_path / res.stdout.strip().split("/")[-1]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["tokenizer"]["name"] == "byte" and meta["dtype"] == "uint16"
    train = meta["splits"]["train"]
    assert train["tokens"] > 500_000 and meta["splits"]["val"]["documents"] > 0
    tokens = np.fromfile(folder / train["shards"][0]["file"], dtype=np.uint16)
    starts = np.fromfile(folder / train["shards"][0]["index"], dtype=np.uint64)
    first = tokens[starts[0] : starts[1]]
    assert first[-1] == 257 and first[:-1].max() < 256
    assert bytes(first[:-1].astype(np.uint8)).decode("utf-8")  # real UTF-8 text
    again = run_kiln("kiln-tokenize", "--default-corpus", "--output", tmp_path)  # second run reuses the folder
    assert again.stdout == res.stdout
