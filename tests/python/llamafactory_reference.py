#!/usr/bin/env python3
"""Independent, test-only reference of LLaMA-Factory 0.9.5's pretraining (stage pt) data pipeline.

Run it with the interpreter of the venv that scripts/setup_lf_reference.sh makes
(${KILN_HOME:-$HOME/.cache/kiln}/venv-lf/bin/python). It calls LLaMA-Factory's OWN code - nothing
below re-implements the pipeline:

  llamafactory.hparams.get_train_args            the YAML keys -> ModelArguments/DataArguments/...
  llamafactory.model.load_tokenizer              AutoTokenizer(padding_side="right", ...)
  llamafactory.data.get_template_and_fix_tokenizer  (pad := eos when the tokenizer has none)
  llamafactory.data.get_dataset(stage="pt")      load, max_samples, concat, split, tokenize, pack
  transformers.DataCollatorForLanguageModeling(mlm=False)   the pt collator (train/pt/workflow.py)
  llamafactory.train.pt.trainer.CustomTrainer    around a tiny random Llama, only to ask
      transformers' Trainer.get_train_dataloader() + Trainer.set_initial_training_values() for the
      figures of the "***** Running training *****" banner, the sampler order of each epoch and
      Trainer.get_batch_samples() for the accumulation windows (num_items_in_batch).

Modes:
  --make-chat-models DIR             DIR/model_llama3, DIR/model_qwen: DIR/model's tokenizer with a
                                     Llama 3 or Qwen2.5 base tokenizer's special tokens (template cases).
  --make-fixture DIR                 write DIR/data (dataset_info.json, docs_a.json, docs_b.jsonl),
                                     DIR/tokenizer (tiny byte-level BPE, eos "</s>", no pad),
                                     DIR/tokenizer_bos (same, with "add_bos_token": true) and
                                     DIR/model (a tiny random LlamaForCausalLM + tokenizer files).
  --data D --tokenizer T KEY=VALUE...  run LLaMA-Factory's data pipeline; print JSON.
                                     KEY=VALUE are LLaMA-Factory YAML keys (values parsed as YAML:
                                     dataset=docs_a,docs_b cutoff_len=64 packing=true val_size=0.1
                                     max_samples=50 preprocessing_batch_size=16 seed=7 ...);
                                     --config FILE.yaml reads them from a YAML file first.
  --cases FILE --data D --tokenizer T
                                     the same for each case of FILE (JSON: {"name": {KEY: VALUE}}),
                                     in one process; prints {"name": result or {"error": message}}
                                     (tests/python/test_lf_parity.py).
  --banner-only N [KEY=VALUE...]     the Trainer banner for a train set of N examples (no data).
  --train-run OUTDIR --data D --model M KEY=VALUE...
                                     run LLaMA-Factory's real `run_exp` (what `llamafactory-cli
                                     train` runs) on CPU with the tiny model; report the files of
                                     OUTDIR, trainer_log.jsonl and the banner lines it logged.
                                     --keep-output: OUTDIR is not emptied first, so LLaMA-Factory
                                     resumes from its newest checkpoint-N by its own rule;
                                     --dump-loaded FILE: the AdamW state and learning rates its
                                     Trainer holds when training begins (after loading a
                                     checkpoint), as safetensors ("<position>.exp_avg", ...) with
                                     the rates in the metadata.

Everything runs offline and on CPU (CUDA_VISIBLE_DEVICES is cleared, HF_*_OFFLINE set).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time

# Offline, CPU, quiet: before any HF import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")
os.environ.setdefault("WANDB_DISABLED", "true")

# Keys the script always sets (a user value for them is refused, except where noted).
FIXED_KEYS = {"stage", "model_name_or_path", "dataset_dir", "output_dir"}

WORDS = (
    "the of and to in is was for on that with as by at from his her an are were which this be or "
    "has had not but it they one all their there been have who would its also new more after when "
    "first two other into time some only can over most such these many may years than city made "
    "kiln llama token packing window shard batch seed eval train epoch step loss block cutoff"
).split()


# ----------------------------------------------------------------------------------------------
# Fixture
# ----------------------------------------------------------------------------------------------
def _make_docs(rng: random.Random, count: int, long_every: int, empty_at: set[int]) -> list[str]:
    docs = []
    for i in range(count):
        if i in empty_at:
            docs.append("")
            continue
        if i % long_every == long_every - 1:
            n = rng.randint(60, 140)  # longer than a small cutoff_len
        elif i % 3 == 0:
            n = rng.randint(1, 6)
        else:
            n = rng.randint(7, 35)
        words = [rng.choice(WORDS) for _ in range(n)]
        text = " ".join(words)
        if rng.random() < 0.3:
            text = text[0].upper() + text[1:] + "."
        if rng.random() < 0.1:
            text += f" {rng.randint(0, 9999)}"
        docs.append(text)
    return docs


def make_fixture(root: str) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    data_dir = os.path.join(root, "data")
    os.makedirs(data_dir, exist_ok=True)
    rng = random.Random(20240529)
    docs_a = _make_docs(rng, 220, long_every=17, empty_at=set())
    docs_b = _make_docs(rng, 160, long_every=11, empty_at={40})
    with open(os.path.join(data_dir, "docs_a.json"), "w", encoding="utf-8") as f:
        json.dump([{"text": t} for t in docs_a], f, ensure_ascii=False, indent=1)
    with open(os.path.join(data_dir, "docs_b.jsonl"), "w", encoding="utf-8") as f:
        for i, t in enumerate(docs_b):
            f.write(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n")
    info = {
        "docs_a": {"file_name": "docs_a.json", "columns": {"prompt": "text"}},
        "docs_b": {"file_name": "docs_b.jsonl", "columns": {"prompt": "text"}},
    }
    with open(os.path.join(data_dir, "dataset_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)

    # Tiny byte-level BPE: 256 byte symbols + 2 specials + merges up to 384 entries.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs_a + docs_b, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    def write_tokenizer(dest: str, add_bos: bool) -> None:
        os.makedirs(dest, exist_ok=True)
        tok.save(os.path.join(dest, "tokenizer.json"))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "model_max_length": 1000000,
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
        }
        if add_bos:
            cfg["add_bos_token"] = True
        with open(os.path.join(dest, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)

    write_tokenizer(os.path.join(root, "tokenizer"), add_bos=False)
    write_tokenizer(os.path.join(root, "tokenizer_bos"), add_bos=True)

    # Tiny random Llama for --train-run (and a copy of the tokenizer next to it).
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = os.path.join(root, "model")
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    write_tokenizer(model_dir, add_bos=False)
    return {
        "data": data_dir,
        "tokenizer": os.path.join(root, "tokenizer"),
        "tokenizer_bos": os.path.join(root, "tokenizer_bos"),
        "model": model_dir,
        "documents": {"docs_a": len(docs_a), "docs_b": len(docs_b)},
        "vocab_size": tok.get_vocab_size(),
        "eos_token_id": tok.token_to_id("</s>"),
        "bos_token_id": tok.token_to_id("<s>"),
    }


def make_chat_models(root: str) -> dict:
    """ROOT/model_llama3 and ROOT/model_qwen: ROOT/model's tokenizer with the special tokens of a
    Llama 3 base tokenizer (EOS <|end_of_text|>, no pad; <|eot_id|>, <|eom_id|>) or of a Qwen2.5
    base tokenizer (EOS and pad <|endoftext|>; <|im_start|>, <|im_end|>) added after its
    vocabulary, and config.json with the vocabulary grown to match (no weights: the template
    cases are data-only)."""
    from tokenizers import AddedToken, Tokenizer

    out = {}
    specs = {
        "model_llama3": (["<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"], "<|end_of_text|>", None),
        "model_qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|endoftext|>"),
    }
    with open(os.path.join(root, "model", "config.json"), encoding="utf-8") as f:
        base_config = json.load(f)
    for name, (tokens, eos, pad) in specs.items():
        dest = os.path.join(root, name)
        os.makedirs(dest, exist_ok=True)
        tok = Tokenizer.from_file(os.path.join(root, "model", "tokenizer.json"))
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
        tok.save(os.path.join(dest, "tokenizer.json"))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": eos,
            "model_max_length": 1000000,
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
        }
        if pad:
            cfg["pad_token"] = pad
        with open(os.path.join(dest, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
        config = dict(base_config, vocab_size=tok.get_vocab_size(), eos_token_id=tok.token_to_id(eos))
        with open(os.path.join(dest, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        out[name] = {"vocab_size": tok.get_vocab_size(), **{t: tok.token_to_id(t) for t in tokens}}
    return out


# ----------------------------------------------------------------------------------------------
# Argument handling
# ----------------------------------------------------------------------------------------------
def parse_kv(items: list[str], config: str | None) -> dict:
    import yaml

    args: dict = {}
    if config:
        with open(config, encoding="utf-8") as f:
            args.update(yaml.safe_load(f) or {})
    for item in items:
        if "=" not in item:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        args[k.strip()] = yaml.safe_load(v) if v != "" else None
    return args


def lf_args(user: dict, data_dir: str | None, model_path: str, output_dir: str) -> dict:
    for k in FIXED_KEYS:
        if k in user and k != "stage":
            user = dict(user)
            user.pop(k)  # set by the script from --data/--tokenizer/--model
    if user.get("stage", "pt") != "pt":
        raise SystemExit("only stage pt is covered")
    args = {
        "stage": "pt",
        "do_train": True,
        "finetuning_type": "full",
        "report_to": "none",
        "dataset": "docs_a,docs_b",
    }
    args.update(user)
    args["model_name_or_path"] = model_path
    args["output_dir"] = output_dir
    if data_dir is not None:
        args["dataset_dir"] = data_dir
    # YAML lists for dataset are accepted by LLaMA-Factory only as a comma string.
    if isinstance(args.get("dataset"), list):
        args["dataset"] = ",".join(args["dataset"])
    return args


@contextlib.contextmanager
def quiet_stdout():
    """LLaMA-Factory prints the first example with print(): keep stdout for the JSON."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def versions() -> dict:
    import accelerate
    import datasets
    import llamafactory
    import tokenizers
    import torch
    import transformers

    return {
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
        "accelerate": accelerate.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
    }


# ----------------------------------------------------------------------------------------------
# Trainer figures (transformers' own code path)
# ----------------------------------------------------------------------------------------------
def tiny_model(vocab_size: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=max(vocab_size, 8),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(cfg)


def make_trainer(training_args, finetuning_args, tokenizer, train_dataset, eval_dataset, collator):
    from llamafactory.train.pt.trainer import CustomTrainer

    model = tiny_model(len(tokenizer) if tokenizer is not None else 8)
    return CustomTrainer(
        model=model,
        args=training_args,
        finetuning_args=finetuning_args,
        data_collator=collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        tokenizer=tokenizer,
        processor=None,
    )


def banner(trainer, args) -> dict:
    """The figures `Trainer._inner_training_loop` logs, from `set_initial_training_values`."""
    dl = trainer.get_train_dataloader()
    (
        num_train_epochs,
        num_update_steps_per_epoch,
        num_examples,
        num_train_samples,
        total_train_batch_size,
        steps_in_epoch,
        max_steps,
    ) = trainer.set_initial_training_values(args, dl)
    ga = args.gradient_accumulation_steps
    remainder = steps_in_epoch % ga if steps_in_epoch else 0
    lines = [
        "***** Running training *****",
        f"  Num examples = {num_examples:,}",
        f"  Num Epochs = {num_train_epochs:,}",
        f"  Num update steps per epoch = {num_update_steps_per_epoch:,}",
        f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}",
        f"  Total train batch size (w. parallel, distributed & accumulation) = {total_train_batch_size:,}",
        f"  Gradient Accumulation steps = {ga}",
        f"  Total optimization steps = {max_steps:,}",
    ]
    return {
        "num_examples": num_examples,
        "num_epochs": num_train_epochs,
        "num_update_steps_per_epoch": num_update_steps_per_epoch,
        "instantaneous_batch_size_per_device": args.per_device_train_batch_size,
        "total_train_batch_size": total_train_batch_size,
        "gradient_accumulation_steps": ga,
        "total_optimization_steps": max_steps,
        "num_train_samples": num_train_samples,
        "batches_per_epoch": steps_in_epoch,
        "last_window_batches": (remainder or ga) if steps_in_epoch else None,
        "world_size": args.world_size,
        "dataloader_drop_last": args.dataloader_drop_last,
        "banner_lines": lines,
        "how": "transformers Trainer.set_initial_training_values(args, Trainer.get_train_dataloader()) "
        "on LLaMA-Factory's CustomTrainer: the variables _inner_training_loop logs",
    }


def sampler_orders(trainer, n: int, epochs: int, seed: int, data_seed) -> dict:
    """Order in which the train sampler visits the packed examples, per epoch."""
    import torch

    dl = trainer.get_train_dataloader()
    sampler = getattr(getattr(dl, "batch_sampler", None), "sampler", None) or getattr(dl, "sampler", None)
    out = {"sampler": type(sampler).__name__}
    if sampler is None or not hasattr(sampler, "set_epoch"):
        return out
    orders = {}
    same = True
    base = data_seed if data_seed is not None else seed
    for e in range(epochs):
        sampler.set_epoch(e)
        order = list(iter(sampler))
        g = torch.Generator()
        g.manual_seed(base + e)
        same = same and order == torch.randperm(n, generator=g).tolist()
        orders[f"epoch{e}"] = order
    out["orders"] = orders
    out["equals_torch_randperm_seed_plus_epoch"] = same
    out["seed_used"] = base
    return out


def windows(trainer, args, epoch: int = 0) -> dict:
    """Accumulation windows of one epoch as `_run_epoch` forms them, with num_items_in_batch."""
    dl = trainer.get_train_dataloader()
    if hasattr(dl, "set_epoch"):
        dl.set_epoch(epoch)
    ga = args.gradient_accumulation_steps
    it = iter(dl)
    result = []
    while True:
        batches, num_items = trainer.get_batch_samples(it, ga, args.device)
        if not batches:
            break
        scored = int(sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches))
        rows = int(sum(int(b["labels"].shape[0]) for b in batches))
        first_col = int(sum(int((b["labels"][:, 0] != -100).sum()) for b in batches))
        result.append(
            {
                "batches": len(batches),
                "rows": rows,
                "num_items_in_batch": None if num_items is None else int(num_items),
                "scored_targets": scored,
                "first_position_labels_not_ignored": first_col,
            }
        )
        if len(batches) < ga:
            break
    return {
        "epoch": epoch,
        "count": len(result),
        "first": result[0] if result else None,
        "last": result[-1] if result else None,
        "model_accepts_loss_kwargs": trainer.model_accepts_loss_kwargs,
        "note": "loss of a window = sum of CE over the shifted targets of all its batches / num_items_in_batch; "
        "num_items_in_batch counts labels != -100 BEFORE the shift (so includes position 0 of every row)",
    }


def _rows(batch) -> list[dict]:
    return [{"input_ids": batch["input_ids"][i].tolist(), "labels": batch["labels"][i].tolist()}
            for i in range(batch["input_ids"].shape[0])]


def stream_run(trainer, args) -> dict:
    """A streaming run's batches as transformers' own loop draws them: Trainer.train() (its
    _inner_training_loop: set_epoch per epoch, windows of gradient_accumulation_steps batches from
    each epoch's start, the next epoch when the stream ends before max_steps) with the forward and
    backward replaced by a recorder, so every micro-batch of the max_steps optimizer steps is seen
    in order, with the window's num_items_in_batch, the optimizer step it ends up in and
    state.epoch after each step. The eval batches: one pass of Trainer.get_eval_dataloader(), as
    each evaluation makes it afresh. Train and eval rows are the collator's (labels -100 at pad =
    EOS), through the torch DataLoader's workers (dataloader_num_workers) and accelerate."""
    import torch
    import transformers

    micro: list[dict] = []
    steps: list[dict] = []

    def training_step(model, inputs, num_items_in_batch=None):
        micro.append({"rows": _rows(inputs), "num_items_in_batch": None if num_items_in_batch is None
                      else int(num_items_in_batch)})
        return torch.tensor(0.0)

    class Steps(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append({"micro_batches": len(micro), "epoch": state.epoch})

    trainer.training_step = training_step
    trainer.add_callback(Steps())
    with quiet_stdout():
        trainer.train()
    out = {"train": {"micro_batches": micro, "steps": steps}}
    if trainer.eval_dataset is not None and not isinstance(trainer.eval_dataset, dict):
        out["eval"] = {"batches": [_rows(b) for b in trainer.get_eval_dataloader()]}
    return out


# ----------------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------------
def run_reference(ns, user: dict) -> dict:
    import datasets
    from transformers import DataCollatorForLanguageModeling

    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    datasets.disable_progress_bars()
    tmp = tempfile.mkdtemp(prefix="lf-ref-")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-datasets")
    datasets.config.HF_DATASETS_CACHE = os.environ["HF_DATASETS_CACHE"]
    t0 = time.time()
    try:
        args = lf_args(user, os.path.abspath(ns.data), os.path.abspath(ns.tokenizer), os.path.join(tmp, "out"))
        with quiet_stdout():
            model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
            tokenizer_module = load_tokenizer(model_args)
            tokenizer = tokenizer_module["tokenizer"]
            template = get_template_and_fix_tokenizer(tokenizer, data_args)
            module = get_dataset(template, model_args, data_args, training_args, stage="pt", **tokenizer_module)
        collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)

        def dump(ds):
            if ds is None:
                return None
            if isinstance(ds, dict):
                return {k: dump(v) for k, v in ds.items()}
            rows = list(iter(ds))  # IterableDataset too (finite here)
            limit = len(rows) if ns.examples < 0 else min(ns.examples, len(rows))
            out = []
            for row in rows[:limit]:
                feat = {"input_ids": row["input_ids"], "attention_mask": row["attention_mask"]}
                batch = collator([feat])
                labels = batch["labels"][0].tolist()
                out.append({"input_ids": row["input_ids"], "labels": labels})
            lens = [len(r["input_ids"]) for r in rows]
            return {
                "num_examples": len(rows),
                "total_tokens": sum(lens),
                "lengths": sorted(set(lens)),
                "examples": out,
            }

        result = {
            "versions": versions(),
            "lf_args": {k: v for k, v in args.items() if k not in ("output_dir",)},
            "effective": {
                "cutoff_len": data_args.cutoff_len,
                "packing": data_args.packing,
                "neat_packing": data_args.neat_packing,
                "val_size": data_args.val_size,
                "max_samples": data_args.max_samples,
                "preprocessing_batch_size": data_args.preprocessing_batch_size,
                "preprocessing_num_workers": data_args.preprocessing_num_workers,
                "streaming": data_args.streaming,
                "buffer_size": data_args.buffer_size,
                "mix_strategy": data_args.mix_strategy,
                "template": data_args.template,
                "seed": training_args.seed,
                "data_seed": training_args.data_seed,
                "per_device_train_batch_size": training_args.per_device_train_batch_size,
                "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
                "num_train_epochs": training_args.num_train_epochs,
                "max_steps": training_args.max_steps,
            },
            "tokenizer": {
                "class": type(tokenizer).__name__,
                "vocab_size": len(tokenizer),
                "eos_token": tokenizer.eos_token,
                "eos_token_id": tokenizer.eos_token_id,
                "pad_token": tokenizer.pad_token,
                "pad_token_id": tokenizer.pad_token_id,
                "bos_token": tokenizer.bos_token,
                "bos_token_id": tokenizer.bos_token_id,
                "add_bos_token": getattr(tokenizer, "add_bos_token", False),
                "padding_side": tokenizer.padding_side,
            },
        }

        # Document-level split, by datasets' own train_test_split on an index column with the
        # same arguments LLaMA-Factory passes (data/data_utils.py split_dataset).
        if not data_args.streaming and data_args.val_size > 1e-6:
            from llamafactory.data.loader import _get_merged_dataset

            with quiet_stdout():
                merged = _get_merged_dataset(data_args.dataset, model_args, data_args, training_args, "pt")
            n = len(merged)
            test_size = int(data_args.val_size) if data_args.val_size > 1 else data_args.val_size
            idx = datasets.Dataset.from_dict({"i": list(range(n))})
            sp = idx.train_test_split(test_size=test_size, seed=training_args.seed)
            result["split"] = {
                "num_documents": n,
                "test_size_arg": test_size,
                "num_test_documents": len(sp["test"]),
                "test_document_order": list(sp["test"]["i"]),
                "train_document_order": list(sp["train"]["i"]),
            }

        # Streaming: what trains is the DataLoader's order (its workers' batches in turn, epoch
        # after epoch), not the IterableDataset iterated here in the main process: stream_run.
        result["train"] = None if data_args.streaming else dump(module.get("train_dataset"))
        result["eval"] = None if data_args.streaming else dump(module.get("eval_dataset"))

        trainer = make_trainer(
            training_args, finetuning_args, tokenizer, module.get("train_dataset"), module.get("eval_dataset"), collator
        )
        result["trainer"] = banner(trainer, training_args)
        if data_args.streaming:
            result["stream"] = stream_run(trainer, training_args)
        train_ds = module.get("train_dataset")
        if isinstance(train_ds, datasets.Dataset) and len(train_ds) > 0:
            n = len(train_ds)
            epochs = min(int(result["trainer"]["num_epochs"]), 3)
            so = sampler_orders(trainer, n, epochs, training_args.seed, training_args.data_seed)
            if n > 2000:
                so["orders"] = {k: v[:100] for k, v in so.get("orders", {}).items()}
            result["trainer"]["sampler"] = so
            if n <= 20000:  # collates a whole epoch
                result["trainer"]["windows_epoch0"] = windows(trainer, training_args, 0)
        result["seconds"] = round(time.time() - t0, 2)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_banner_only(ns, user: dict) -> dict:
    import torch

    from llamafactory.hparams import get_train_args

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n: int):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"input_ids": [1, 2], "attention_mask": [1, 1]}

    tmp = tempfile.mkdtemp(prefix="lf-banner-")
    try:
        args = lf_args(user, None, ns.tokenizer or "unused-model", os.path.join(tmp, "out"))
        args.setdefault("dataset", "unused")
        with quiet_stdout():
            model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
        trainer = make_trainer(training_args, finetuning_args, None, Rows(ns.banner_only), None, lambda f: f)
        return {"versions": versions(), "lf_args": args, "trainer": banner(trainer, training_args)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _DumpLoaded(path: str):
    import transformers
    from safetensors.torch import save_file

    class DumpLoaded(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            tensors, position = {}, 0
            for group in optimizer.param_groups:
                for p in group["params"]:
                    for key, value in optimizer.state[p].items():
                        tensors[f"{position}.{key}"] = value.detach().clone().contiguous()
                    position += 1
            meta = {"lrs": json.dumps([g["lr"] for g in optimizer.param_groups]),
                    "last_lr": json.dumps(list(lr_scheduler.get_last_lr())),
                    "global_step": str(state.global_step)}
            save_file(tensors, path, metadata=meta)

    return DumpLoaded()


def run_train(ns, user: dict) -> dict:
    import datasets
    import transformers

    from llamafactory.train.tuner import run_exp

    datasets.disable_progress_bars()
    out = os.path.abspath(ns.train_run)
    if os.path.exists(out) and not ns.keep_output:
        shutil.rmtree(out)
    tmp = tempfile.mkdtemp(prefix="lf-train-")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf-datasets")
    datasets.config.HF_DATASETS_CACHE = os.environ["HF_DATASETS_CACHE"]
    defaults = {
        "logging_steps": 1,
        "save_steps": 2,
        "learning_rate": 1.0e-3,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.1,
        "num_train_epochs": 1.0,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "cutoff_len": 64,
        "val_size": 0.1,
        "do_eval": True,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 4,
        "plot_loss": False,
        "save_only_model": False,
    }
    defaults.update(user)
    args = lf_args(defaults, os.path.abspath(ns.data), os.path.abspath(ns.model), out)
    cap = _Capture()
    tlog = transformers.utils.logging.get_logger("transformers.trainer")
    tlog.addHandler(cap)
    transformers.utils.logging.set_verbosity_info()
    t0 = time.time()
    callbacks = [_DumpLoaded(ns.dump_loaded)] if ns.dump_loaded else None
    try:
        with quiet_stdout():
            run_exp(args, callbacks)
    finally:
        tlog.removeHandler(cap)
        shutil.rmtree(tmp, ignore_errors=True)
    files = []
    for dirpath, _, names in os.walk(out):
        for name in names:
            p = os.path.join(dirpath, name)
            files.append({"path": os.path.relpath(p, out), "bytes": os.path.getsize(p)})
    files.sort(key=lambda x: x["path"])

    def read_json(name):
        p = os.path.join(out, name)
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                return json.load(f)
        return None

    log_lines = []
    p = os.path.join(out, "trainer_log.jsonl")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            log_lines = [json.loads(line) for line in f if line.strip()]
    readme = None
    p = os.path.join(out, "README.md")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            readme = f.read()
    start = next((i for i, s in enumerate(cap.lines) if "Running training" in s), None)
    return {
        "versions": versions(),
        "lf_args": args,
        "seconds": round(time.time() - t0, 2),
        "files": files,
        "trainer_log.jsonl": log_lines,
        "train_results.json": read_json("train_results.json"),
        "eval_results.json": read_json("eval_results.json"),
        "all_results.json": read_json("all_results.json"),
        "trainer_state.json(keys)": sorted((read_json("trainer_state.json") or {}).keys()),
        "README.md": readme,
        "banner_log": cap.lines[start : start + 9] if start is not None else [],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-fixture", metavar="DIR")
    ap.add_argument("--make-chat-models", metavar="DIR", help="DIR/model_llama3 and DIR/model_qwen from DIR/model")
    ap.add_argument("--data", help="folder with dataset_info.json")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json/tokenizer_config.json")
    ap.add_argument("--model", help="model folder for --train-run")
    ap.add_argument("--config", help="LLaMA-Factory YAML to start from")
    ap.add_argument("--banner-only", type=int, metavar="N")
    ap.add_argument("--cases", metavar="FILE", help="JSON {name: {KEY: VALUE}}: run each case")
    ap.add_argument("--train-run", metavar="OUTDIR")
    ap.add_argument("--keep-output", action="store_true", help="--train-run: resume from OUTDIR's newest checkpoint")
    ap.add_argument("--dump-loaded", metavar="FILE", help="--train-run: the optimizer state when training begins")
    ap.add_argument("--examples", type=int, default=-1, help="examples per split to print (-1: all)")
    ap.add_argument("--output", help="write the JSON here instead of stdout")
    ap.add_argument("--pretty", action="store_true")
    ap.add_argument("kv", nargs="*", help="LLaMA-Factory YAML keys as KEY=VALUE")
    ns = ap.parse_args()

    # LLaMA-Factory logs to sys.stdout (its handler takes the stream when it is created) and prints
    # the first example with print(): everything but the JSON goes to stderr.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    user = parse_kv(ns.kv, ns.config)
    if ns.make_fixture:
        result = make_fixture(os.path.abspath(ns.make_fixture))
    elif ns.make_chat_models:
        result = make_chat_models(os.path.abspath(ns.make_chat_models))
    elif ns.banner_only is not None:
        result = run_banner_only(ns, user)
    elif ns.train_run:
        if not (ns.data and ns.model):
            ap.error("--train-run needs --data and --model")
        result = run_train(ns, user)
    elif ns.cases:
        if not (ns.data and ns.tokenizer):
            ap.error("--data and --tokenizer are required")
        with open(ns.cases, encoding="utf-8") as f:
            cases = json.load(f)
        result = {}
        for name, kv in cases.items():
            kv = dict(kv)
            case_ns = argparse.Namespace(**vars(ns))
            if "_model" in kv:  # a sibling folder of --tokenizer (fixtures/lf_parity/model_llama3, ...)
                case_ns.tokenizer = os.path.join(os.path.dirname(os.path.abspath(ns.tokenizer)), kv.pop("_model"))
            kv.pop("_error_key", None)
            try:
                result[name] = run_reference(case_ns, kv)
            except (Exception, SystemExit) as e:  # LLaMA-Factory's refusal is a result too
                result[name] = {"error": f"{type(e).__name__}: {e}"}
    else:
        if not (ns.data and ns.tokenizer):
            ap.error("--data and --tokenizer are required")
        result = run_reference(ns, user)

    text = json.dumps(result, indent=1 if ns.pretty else None, separators=None if ns.pretty else (",", ":"))
    if ns.output:
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        real_stdout.write(text + "\n")
        real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
