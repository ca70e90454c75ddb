#!/usr/bin/env python3
"""Tokenizer throughput, kiln vs HF `tokenizers`, side by side on the same text in one run.

Trains a tokenizer.json (8k vocab) on the embedded corpus unless --tokenizer is given: byte-level
BPE in Llama-3 style (--style llama3, the default), or SentencePiece-BPE in Llama-2's layout
(--style llama2: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, so a whole document
is one BPE word, byte fallback to <0x00>..<0xFF>; trained with a Metaspace split so that, as in
Llama-2's vocabulary, no token spans two words). Then times single-thread encoding (a loop of
encode() in HF, one thread in kiln) and multi-thread encoding (encode_batch in HF with
RAYON_NUM_THREADS threads, kiln's --threads) of the same documents, and prints tokens/s and the
kiln/HF ratio. Not a test: numbers depend on the machine.
Usage: scripts/bench_tokenizer.py [--tokenizer PATH | --style llama3|llama2] [--threads N] [--repeat R]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", help="tokenizer.json (default: train one on the embedded corpus)")
    ap.add_argument("--style", choices=["llama3", "llama2"], default="llama3", help="the tokenizer to train")
    ap.add_argument("--input", nargs="+", default=[str(p) for p in sorted((ROOT / "data/corpus").glob("*.jsonl"))])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build", default=os.environ.get("KILN_BUILD_DIR", str(ROOT / "build")))
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    docs = []
    for path in args.input:
        with open(path, encoding="utf-8") as f:
            docs += [json.loads(line)["text"] for line in f if line.strip()] if path.endswith(".jsonl") else [f.read()]

    with tempfile.TemporaryDirectory() as tmp:
        path = args.tokenizer
        if not path and args.style == "llama2":
            tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
            tok.train_from_iterator(docs, trainers.BpeTrainer(
                vocab_size=8192 - 256, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
            spec = json.loads(tok.to_str())  # Llama-2's ids: <unk> <s> </s>, <0x00>..<0xFF>, the rest
            order = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
            order = order[:3] + [f"<0x{b:02X}>" for b in range(256)] + order[3:]
            spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
            tok = Tokenizer.from_str(json.dumps(spec))
            tok.pre_tokenizer = None
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
            tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
            path = str(Path(tmp) / "tokenizer.json")
            tok.save(path)
        elif not path:
            tok = Tokenizer(models.BPE(ignore_merges=True))
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
            )
            tok.decoder = decoders.ByteLevel()
            tok.train_from_iterator(docs, trainers.BpeTrainer(
                vocab_size=8192, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False))
            path = str(Path(tmp) / "tokenizer.json")
            tok.save(path)
        hf = Tokenizer.from_file(path)

        hf.encode_batch(docs[:100], add_special_tokens=False)  # warm-up
        start = time.perf_counter()
        for _ in range(args.repeat):
            tokens = sum(len(hf.encode(d, add_special_tokens=False).ids) for d in docs)
        hf_single = tokens * args.repeat / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(args.repeat):
            hf.encode_batch(docs, add_special_tokens=False)
        hf_multi = tokens * args.repeat / (time.perf_counter() - start)

        cmd = [str(Path(args.build) / "bin/kiln-tokenize"), "--bench", "--tokenizer", path, "--threads", str(args.threads),
               "--repeat", str(args.repeat)] + [a for p in args.input for a in ("--input", p)]
        kiln = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if kiln["tokens"] != tokens:
        sys.exit(f"token counts differ: kiln {kiln['tokens']} vs HF {tokens}")

    mb = sum(len(d.encode()) for d in docs) / 1e6
    trained = "(trained, 8k " + ("Llama-3 style)" if args.style == "llama3" else "Llama-2 SentencePiece-BPE layout)")
    print(f"{len(docs)} documents, {mb:.1f} MB, {tokens} tokens, {args.threads} threads, tokenizer "
          f"{path if args.tokenizer else trained}")
    print(f"{'':14}{'kiln tok/s':>14}{'HF tok/s':>14}{'kiln/HF':>10}")
    for name, k, h in (("single-thread", kiln["single_thread_tokens_per_s"], hf_single),
                       ("multi-thread", kiln["multi_thread_tokens_per_s"], hf_multi)):
        print(f"{name:14}{k:14,.0f}{h:14,.0f}{k / h:10.2f}")


if __name__ == "__main__":
    main()
