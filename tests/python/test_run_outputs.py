"""The outputs LLaMA-Factory's and HF's tools read (issue 15, point 5): trainer_state.json in each
checkpoint and in output_dir, train/eval/all_results.json, plot_loss's figures and TensorBoard
event files (report_to: tensorboard).

References: transformers' TrainerState.load_from_json (refuses any key TrainerState lacks); the
tensorboard package's record reader (checks both CRC-32Cs of every record) and EventAccumulator;
PIL decoding the PNGs; and kiln's own log lines, which every stored number must equal.
"""
import ast
import json
import math
import os
import socket
import subprocess

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.proto import event_pb2  # noqa: E402
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow  # noqa: E402

RUN = ["--device", "cpu", "--cutoff_len", "64", "--per_device_train_batch_size", "4", "--learning_rate", "3e-3",
       "--logging_steps", "2", "--eval_steps", "4", "--val_size", "4", "--save_steps", "8"]
SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss",
                "epoch", "step"}


def pretrain(kiln_bin, *args, env=None):
    res = subprocess.run([str(kiln_bin("kiln-pretrain")), *map(str, args)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def log_lines(stderr: str):
    """kiln's HF-style log lines: (training windows, evaluations), each a dict (+ tokens/s, MFU, memory)."""
    train, evals = [], []
    for line in stderr.splitlines():
        if line.startswith("{'loss'"):
            head, tail = line.split("}", 1)
            d = ast.literal_eval(head + "}")
            d["tokens_per_second"] = float(tail.split("tokens/s")[0].replace(",", ""))
            d["mfu_percent"] = float(tail.split("MFU ")[1].split("%")[0])
            d["peak_mib"] = float(tail.split("peak ")[1].split(" MiB")[0])
            train.append(d)
        elif line.startswith("{'eval_loss'"):
            evals.append(ast.literal_eval(line))
    return train, evals


def records(path):
    """Every Event of a file through tensorboard's own record reader (raises on a bad CRC)."""
    reader = pywrap_tensorflow.PyRecordReader_New(str(path))
    out = []
    while True:
        try:
            reader.GetNext()
        except Exception as e:  # OutOfRangeError at the end; DataLossError would be a bad record
            assert type(e).__name__ == "OutOfRangeError", e
            return out
        out.append(event_pb2.Event.FromString(reader.record()))


def test_trainer_state_results_figures_and_tensorboard_match_the_log(kiln_bin, tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    res = pretrain(kiln_bin, *RUN, "--max_steps", 12, "--output_dir", out, "--plot_loss", "true",
                   "--report_to", "tensorboard", "--logging_dir", tb)
    train, evals = log_lines(res.stderr)
    assert len(train) == 6 and len(evals) == 3, res.stderr
    train_steps, eval_steps = [2, 4, 6, 8, 10, 12], [4, 8, 12]

    # trainer_state.json in output_dir: TrainerState reads it; log_history holds HF's entries with
    # the logged values (the log prints 4 decimals), and the closing summary.
    state = transformers.TrainerState.load_from_json(str(out / "trainer_state.json"))
    assert (state.global_step, state.max_steps, state.logging_steps, state.eval_steps, state.save_steps,
            state.train_batch_size, state.num_train_epochs) == (12, 12, 2, 4, 8, 4, 1)
    history = state.log_history
    windows = [h for h in history if "loss" in h]
    evaluations = [h for h in history if "eval_loss" in h]
    assert [h["step"] for h in windows] == train_steps and [h["step"] for h in evaluations] == eval_steps
    for h, line in zip(windows, train):
        assert {"loss", "grad_norm", "learning_rate", "epoch", "step"} <= h.keys()
        assert abs(h["loss"] - line["loss"]) <= 5e-5 and abs(h["grad_norm"] - line["grad_norm"]) <= 5e-5
        assert math.isclose(h["learning_rate"], line["learning_rate"], rel_tol=1e-3)
        assert abs(h["epoch"] - line["epoch"]) <= 5e-3
    for h, line in zip(evaluations, evals):
        assert {"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch"} <= h.keys()
        assert abs(h["eval_loss"] - line["eval_loss"]) <= 5e-5 and h["step"] == line["step"]
    summary = history[-1]
    assert set(summary) == SUMMARY_KEYS and summary["step"] == 12
    assert math.isclose(summary["train_loss"], sum(line["loss"] for line in train) / len(train), abs_tol=1e-4)
    assert summary["total_flos"] == state.total_flos > 0
    assert summary["train_steps_per_second"] == pytest.approx(12 / summary["train_runtime"], rel=0.01)
    assert summary["train_samples_per_second"] == pytest.approx(48 / summary["train_runtime"], rel=0.01)

    # Each checkpoint's state is the history up to it (evaluation at 8 included, no summary).
    ckpt8 = transformers.TrainerState.load_from_json(str(out / "checkpoint-8" / "trainer_state.json"))
    assert ckpt8.global_step == 8 and ckpt8.log_history == history[:len(ckpt8.log_history)]
    assert ckpt8.log_history[-1]["eval_loss"] == evaluations[1]["eval_loss"]
    assert 0 < ckpt8.total_flos < state.total_flos
    ckpt12 = transformers.TrainerState.load_from_json(str(out / "checkpoint-12" / "trainer_state.json"))
    assert ckpt12.log_history == history[:-1]
    assert json.loads((out / "checkpoint-12" / "kiln_state.json").read_text()) == {"world_size": 1, "zero_stage": 0}

    # Trainer.save_metrics's files; LLaMA-Factory adds the perplexity of the evaluation.
    train_results = json.loads((out / "train_results.json").read_text())
    assert train_results == {k: v for k, v in summary.items() if k != "step"}
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert eval_results == {k: v for k, v in evaluations[-1].items() if k not in ("step", "eval_tokens")}
    assert eval_results["eval_perplexity"] == pytest.approx(math.exp(eval_results["eval_loss"]), rel=1e-12)
    assert json.loads((out / "all_results.json").read_text()) == {**train_results, **eval_results}

    # TensorBoard: one event file whose records all pass the reader's CRC checks, "brain.Event:2"
    # first; HF's tags (train/*, eval/*) plus kiln's, equal to the logged values at their steps.
    (event_file,) = list(tb.glob("events.out.tfevents.*"))
    events = records(event_file)
    assert events[0].file_version == "brain.Event:2"
    acc = EventAccumulator(str(tb))
    acc.Reload()
    scalars = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train/epoch", "train/tokens_per_second",
                "train/mfu", "train/peak_memory_bytes", "eval/loss"):
        assert tag in scalars, sorted(scalars)
    for tag in ("train/train_loss", "train/train_runtime", "train/total_flos"):
        assert [e.step for e in scalars[tag]] == [12]
    assert [e.step for e in scalars["train/loss"]] == train_steps
    assert [e.step for e in scalars["eval/loss"]] == eval_steps

    def close(tag, key, atol=0.0, rtol=0.0, scale=1.0, lines=train):
        """The event values equal the log line's, within the line's rounding (and float32's)."""
        assert len(scalars[tag]) == len(lines)
        for e, line in zip(scalars[tag], lines):
            assert abs(e.value * scale - line[key]) <= atol + rtol * abs(line[key]), (tag, e.value, line[key])

    close("train/loss", "loss", atol=6e-5)  # {:.4f}
    close("train/grad_norm", "grad_norm", atol=6e-5)
    close("train/learning_rate", "learning_rate", rtol=6e-4)  # {:.3e}
    close("train/mfu", "mfu_percent", atol=0.051, scale=100)  # {:.1f}%
    close("train/tokens_per_second", "tokens_per_second", atol=1.0)  # whole tokens
    close("train/peak_memory_bytes", "peak_mib", atol=0.006, scale=1 / 2**20)  # {:.2f} MiB
    close("eval/loss", "eval_loss", atol=6e-5, lines=evals)
    assert scalars["train/train_loss"][0].value == pytest.approx(summary["train_loss"], rel=1e-6)

    # plot_loss: LLaMA-Factory's two figures, 640x480 (matplotlib's default at dpi 100), with
    # pixels of the curves' color (#1f77b4) in them.
    from PIL import Image
    for name in ("training_loss.png", "training_eval_loss.png"):
        with Image.open(out / name) as img:
            assert img.format == "PNG" and img.size == (640, 480)
            colors = img.convert("RGB").getcolors(maxcolors=640 * 480)
            blue = sum(n for n, (r, g, b) in colors if abs(r - 0x1f) < 8 and abs(g - 0x77) < 8 and abs(b - 0xb4) < 8)
            assert blue > 200, (name, blue)
    assert "figure saved at" in res.stderr


def test_a_resumed_run_continues_the_history_and_writes_to_hf_default_logging_dir(kiln_bin, tmp_path):
    out = tmp_path / "run"
    pretrain(kiln_bin, *RUN, "--max_steps", 8, "--output_dir", out)
    assert not (out / "runs").exists() and not (out / "training_loss.png").exists()  # report_to none, no plot
    before = transformers.TrainerState.load_from_json(str(out / "checkpoint-8" / "trainer_state.json"))
    env = {k: v for k, v in os.environ.items() if k != "TENSORBOARD_LOGGING_DIR"}
    res = pretrain(kiln_bin, *RUN, "--max_steps", 12, "--output_dir", out, "--resume_from_checkpoint", "true",
                   "--report_to", "tensorboard", env=env)
    train, _ = log_lines(res.stderr)
    state = transformers.TrainerState.load_from_json(str(out / "trainer_state.json"))
    assert state.log_history[:len(before.log_history)] == before.log_history  # as HF: the history continues
    new = state.log_history[len(before.log_history):]
    assert [h["step"] for h in new if "loss" in h] == [10, 12] and new[-1]["step"] == 12
    assert [abs(h["loss"] - line["loss"]) <= 5e-5 for h, line in zip([h for h in new if "loss" in h], train)] == [
        True, True]
    assert state.total_flos == pytest.approx(before.total_flos * 12 / 8, rel=1e-9)  # cumulative, as HF
    # HF's default logging_dir: output_dir/runs/<Mon DD_HH-MM-SS>_<hostname>, holding this run's steps only.
    (run_dir,) = list((out / "runs").iterdir())
    assert run_dir.name.endswith("_" + socket.gethostname())
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [10, 12]


def test_report_to_names_hf_integrations_and_refuses_unknown_ones(run_kiln, tmp_path):
    out = run_kiln("kiln-pretrain", "--dry-run", "--report_to", "wandb,tensorboard", "--output_dir", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "report_to" in out.stderr and "wandb" in out.stderr and "ignored" in out.stderr
    out = run_kiln("kiln-pretrain", "--dry-run", "--report_to", "tensorbord", "--output_dir", tmp_path)
    assert out.returncode == 2 and "report_to" in out.stderr and "'tensorbord'" in out.stderr
