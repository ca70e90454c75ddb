"""Issue 53, item 6: kiln-pretrain with LLaMA-Factory's `streaming: true` over local files, end to
end on the lf_parity fixture: it trains, evaluates the take(val_size) stream, writes HF's files
with a stream's figures, and a run resumed from a checkpoint (one saved after the stream crossed
into its second epoch included) continues with exactly the batches, losses and evaluations of
the uninterrupted run. The refusals: dataloader_num_workers 0 (LLaMA-Factory's empty stream) and
several processes.

test_lf_parity.py compares the streamed batches and a whole run's losses with LLaMA-Factory
itself; tests/data/test_stream_dataset.cpp the stream's memory and restored positions.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import lf_parity

FIXTURE = lf_parity.FIXTURE
INT64_MAX = 9223372036854775807

# 2 DataLoader workers, val_size 5: epoch 0's train stream has 223 batches of 2, so step 56
# joins its last 3-batch window with epoch 1's first window (docs/training.md, "Streaming").
KEYS = {
    "stage": "pt", "do_train": True, "finetuning_type": "full", "model_name_or_path": str(FIXTURE / "model"),
    "dataset_dir": str(FIXTURE / "data"), "dataset": "docs_a,docs_b", "cutoff_len": 32, "seed": 7,
    "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "streaming": True, "buffer_size": 64,
    "val_size": 5, "max_steps": 60, "dataloader_num_workers": 2, "do_eval": True, "eval_strategy": "steps",
    "eval_steps": 20, "per_device_eval_batch_size": 3, "save_steps": 19, "logging_steps": 1,
    "learning_rate": 1.0e-3, "report_to": "none",
}


def run(pretrain: Path, work: Path, name: str, extra: dict | None = None, env: dict | None = None,
        args: tuple = ()) -> subprocess.CompletedProcess:
    config = {**KEYS, "output_dir": str(work / name), **(extra or {})}
    yaml = work / f"{name}.yaml"
    yaml.write_text("".join(f"{k}: {lf_parity.yaml_value(v)}\n" for k, v in config.items()))
    return subprocess.run([str(pretrain), "--config", str(yaml), "--device", "cpu", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "KILN_HOME": str(work / "home"), **(env or {})})


def history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def test_streaming_trains_evaluates_and_resumes_exactly(kiln_bin, tmp_path):
    pretrain = kiln_bin("kiln-pretrain")
    p = run(pretrain, tmp_path, "full")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "full"
    assert "Num Epochs = 9,223,372,036,854,775,807" in p.stdout
    assert "Num examples = 480" in p.stdout  # max_steps x total batch
    assert "streamed as LLaMA-Factory's streaming: true" in p.stdout
    assert "Num examples: Unknown" in p.stderr + p.stdout  # HF's evaluation banner for a stream
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["num_train_epochs"] == INT64_MAX
    assert state["global_step"] == 60
    log = state["log_history"]
    train = {e["step"]: e for e in log if "loss" in e}
    evals = {e["step"]: e for e in log if "eval_loss" in e}
    assert sorted(train) == list(range(1, 61))
    assert sorted(evals) == [20, 40, 60]
    # The step that joins epoch 0's cut window with epoch 1's first logs both windows' losses.
    assert train[56]["loss"] > 1.8 * train[55]["loss"]
    assert train[56]["epoch"] == pytest.approx(1 + 4 / 240, rel=1e-12)
    assert train[60]["epoch"] == pytest.approx(1 + 20 / 240, rel=1e-12)
    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval_loss"] == pytest.approx(evals[60]["eval_loss"], rel=1e-12)
    assert (out / "model.safetensors").exists()
    # The checkpoints record the stream's position: step 56 read epoch 1's first 4 batches, step
    # 57 the next 4.
    position = json.loads((out / "checkpoint-57" / "loader_state.json").read_text())
    assert (position["order"], position["epoch"], position["position"]) == ("stream", 1, 8)
    assert "buffer_size 64" in position["stream"]

    for checkpoint in (38, 57):  # within epoch 0, and after the stream crossed into epoch 1
        name = f"resumed_{checkpoint}"
        q = run(pretrain, tmp_path, name, {"resume_from_checkpoint": str(out / f"checkpoint-{checkpoint}")})
        assert q.returncode == 0, q.stderr
        mine = history(tmp_path / name)
        resumed_train = {e["step"]: e for e in mine if "loss" in e and e["step"] > checkpoint}
        assert sorted(resumed_train) == list(range(checkpoint + 1, 61))
        for step, e in resumed_train.items():
            assert e["loss"] == pytest.approx(train[step]["loss"], abs=1e-6), (checkpoint, step)
            assert e["epoch"] == train[step]["epoch"], (checkpoint, step)
        resumed_evals = {e["step"]: e["eval_loss"] for e in mine if "eval_loss" in e and e["step"] > checkpoint}
        assert resumed_evals == pytest.approx({s: evals[s]["eval_loss"] for s in resumed_evals}, abs=1e-6)
        assert 60 in resumed_evals

    # Another stream's checkpoint is refused, naming what differs.
    q = run(pretrain, tmp_path, "other_buffer",
            {"buffer_size": 65, "resume_from_checkpoint": str(out / "checkpoint-38")})
    assert q.returncode != 0
    assert "loader_state.json" in q.stderr and "stream" in q.stderr


def test_streaming_refusals(kiln_bin, tmp_path):
    pretrain = kiln_bin("kiln-pretrain")
    # transformers' default dataloader_num_workers 0: LLaMA-Factory's stream is empty and it fails.
    p = run(pretrain, tmp_path, "workers_0", {"dataloader_num_workers": 0}, args=("--dry-run",))
    assert p.returncode != 0
    assert "dataloader_num_workers" in p.stderr and "LLaMA-Factory 0.9.5" in p.stderr
    assert "StopIteration" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    # Several processes: accelerate's dispatch of an iterable is not reproduced; refused before
    # any data is read (no shard folder is written).
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    p = run(pretrain, tmp_path, "ranks", env=torchrun, args=("--dry-run",))
    assert p.returncode != 0
    assert "streaming" in p.stderr and "2 processes" in p.stderr and "DataLoaderDispatcher" in p.stderr
    assert not (tmp_path / "home" / "data").exists()
