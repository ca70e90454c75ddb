#!/usr/bin/env python3
"""Seed inputs for the libFuzzer harnesses (tests/fuzz/libfuzzer, run by scripts/fuzz.sh): real
files as their writers write them, one folder per harness.

  fuzz_pt_file/       optimizer.pt, scheduler.pt, scaler.pt written by torch.save from
                      torch.optim.AdamW over HF's two parameter groups, transformers' cosine
                      LambdaLR and a GradScaler's state; kiln's own with --kiln-checkpoint
  fuzz_torch_pickle/  the data.pkl of those files, and of small state dicts whose storages are the
                      harness's fixed records (data/0: 128 bytes, data/1: 16 bytes)
  fuzz_safetensors/   files written by the safetensors library (weights, a random state)
  fuzz_state_json/    trainer_state.json by transformers' TrainerState, kiln_state.json

Usage: fuzz_seeds.py OUT [--kiln-checkpoint DIR]
"""
import argparse
import io
import json
import shutil
import zipfile
from pathlib import Path

import torch


def data_pkl(blob: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--kiln-checkpoint", type=Path, help="a checkpoint folder kiln-pretrain wrote")
    args = ap.parse_args()
    dirs = {h: args.out / h for h in ("fuzz_pt_file", "fuzz_torch_pickle", "fuzz_safetensors", "fuzz_state_json")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    # The parameters the .pt harness expects (fuzz_pt_file.cpp): two weights, one norm.
    params = {"embed.weight": torch.nn.Parameter(torch.randn(8, 4)),
              "proj.weight": torch.nn.Parameter(torch.randn(4, 4)),
              "norm.weight": torch.nn.Parameter(torch.ones(4))}
    decay = [p for n, p in params.items() if p.dim() > 1]
    rest = [p for n, p in params.items() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    try:
        from transformers import get_cosine_schedule_with_warmup
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10)
    except ImportError:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sum((p * p).sum() for p in params.values()).backward()
    opt.step()
    sched.step()
    scaler = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
              "_growth_tracker": 3}
    files = {"optimizer.pt": saved(opt.state_dict()), "scheduler.pt": saved(sched.state_dict()),
             "scaler.pt": saved(scaler)}
    # Small state dicts over the pickle harness's records: "0" a 32-float storage, "1" a 4-float one.
    big, small = torch.arange(32, dtype=torch.float32), torch.ones(4)
    # (torch.save numbers storages as it meets them: the 32-float one first)
    files["views.pt"] = saved({"state": {0: {"exp_avg": big[4:12].view(2, 4), "exp_avg_sq": big.view(4, 8).t(),
                                              "step": small[0]}},
                               "param_groups": [{"lr": 0.5, "betas": (0.9, 0.999), "params": [0]}]})
    files["lists.pt"] = saved({"_last_lr": [1e-3, 1e-3], "base_lrs": [1e-3, 1e-3], "last_epoch": 4,
                               "t": [big, small, big[1:]], "nested": [[[1, 2.5, None, True, "x"]]]})
    for name, blob in files.items():
        (dirs["fuzz_pt_file"] / name).write_bytes(blob)
        (dirs["fuzz_torch_pickle"] / (name + ".pkl")).write_bytes(data_pkl(blob))

    from safetensors.torch import save_file
    save_file({k: v.detach() for k, v in params.items()}, str(dirs["fuzz_safetensors"] / "model.safetensors"))
    save_file({"cpu": torch.get_rng_state()}, str(dirs["fuzz_safetensors"] / "rng_state.safetensors"))
    save_file({"a": torch.zeros(2, 3, dtype=torch.bfloat16), "b": torch.arange(5, dtype=torch.int64),
               "c": torch.zeros(0)}, str(dirs["fuzz_safetensors"] / "mixed.safetensors"), metadata={"format": "pt"})

    try:
        from transformers import TrainerState
        state = TrainerState(global_step=4, max_steps=10, logging_steps=1, eval_steps=2, save_steps=4,
                             train_batch_size=8, num_train_epochs=1, total_flos=1.5e12, epoch=0.4)
        state.log_history = [{"loss": 2.5, "grad_norm": 1.25, "learning_rate": 1e-3, "epoch": 0.1, "step": s}
                             for s in range(1, 5)]
        state.save_to_json(str(dirs["fuzz_state_json"] / "trainer_state.json"))
    except ImportError:
        (dirs["fuzz_state_json"] / "trainer_state.json").write_text(json.dumps(
            {"global_step": 4, "max_steps": 10, "total_flos": 1.5e12, "log_history": [{"loss": 2.5, "step": 1}]}))
    (dirs["fuzz_state_json"] / "kiln_state.json").write_text(json.dumps({"world_size": 1, "zero_stage": 0}, indent=2))

    if args.kiln_checkpoint:
        ck = args.kiln_checkpoint
        for name in ("optimizer.pt", "scheduler.pt", "scaler.pt"):
            if (ck / name).is_file():
                shutil.copy(ck / name, dirs["fuzz_pt_file"] / ("kiln-" + name))
                (dirs["fuzz_torch_pickle"] / ("kiln-" + name + ".pkl")).write_bytes(data_pkl((ck / name).read_bytes()))
        for name in ("optimizer.safetensors", "rng_state.safetensors"):
            if (ck / name).is_file():
                shutil.copy(ck / name, dirs["fuzz_safetensors"] / ("kiln-" + name))
        for name in ("trainer_state.json", "kiln_state.json"):
            if (ck / name).is_file():
                shutil.copy(ck / name, dirs["fuzz_state_json"] / ("kiln-" + name))


if __name__ == "__main__":
    main()
