"""What test_lf_parity.py compares between kiln and LLaMA-Factory 0.9.5, for one case.

Both sides are reduced to the same summary: per split the number of examples, their tokens and
lengths, a SHA-256 of all input_ids and of all labels (so every token of every example counts),
and the first two examples in full (readable in a diff); the banner's figures and lines; the
sampler's first epochs. A streaming case has no splits to list: its summary is the DataLoader's
batches instead, every train micro-batch of the max_steps steps and one evaluation's batches
(`stream`). `reduce_reference` reads tests/python/llamafactory_reference.py's JSON,
`reduce_kiln` reads kiln-pretrain --dry-run --dump-data's JSON and banner.

Regenerate the stored summaries (fixtures/lf_parity/expected.json) from the real LLaMA-Factory:
    PY=$(scripts/setup_lf_reference.sh --print)
    $PY tests/python/lf_parity.py --write-expected
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lf_parity"
BANNER_FIGURES = ("num_examples", "num_epochs", "num_update_steps_per_epoch", "total_train_batch_size",
                  "gradient_accumulation_steps", "total_optimization_steps", "batches_per_epoch",
                  "last_window_batches")


def cases() -> dict[str, dict]:
    """{name: the case's LLaMA-Factory keys, base included}."""
    spec = json.loads((FIXTURE / "cases.json").read_text())
    return {name: {**spec["base"], **kv} for name, kv in spec["cases"].items()}


def _digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def _split(s: dict | None) -> dict | None:
    if s is None:
        return None
    if "examples" not in s:  # eval_on_each_dataset: {dataset name: split}
        return {name: _split(v) for name, v in s.items()}
    examples = s["examples"]
    assert len(examples) == s["num_examples"], "the summary needs every example"
    return {
        "num_examples": s["num_examples"],
        "total_tokens": s["total_tokens"],
        "lengths": sorted(set(s["lengths"])),
        "input_ids_sha256": _digest([e["input_ids"] for e in examples]),
        "labels_sha256": _digest([e["labels"] for e in examples]),
        "first_examples": examples[:2],
    }


def _rows_digest(batches, key: str) -> str:
    return _digest([[row[key] for row in rows] for rows in batches])


def _stream(s: dict) -> dict:
    """A streaming run: every train micro-batch of the max_steps optimizer steps in order (rows,
    the window's num_items_in_batch, the step each ends up in, state.epoch after each step) and
    the batches of one evaluation, as digests plus the first two batches in full."""
    micro = s["train"]["micro_batches"]
    batches = [m["rows"] for m in micro]
    out = {"train": {
        "micro_batches": len(micro),
        "rows": [len(b) for b in batches],
        "num_items_in_batch": [m["num_items_in_batch"] for m in micro],
        "steps": [st["micro_batches"] for st in s["train"]["steps"]],
        "epochs": [st["epoch"] for st in s["train"]["steps"]],
        "input_ids_sha256": _rows_digest(batches, "input_ids"),
        "labels_sha256": _rows_digest(batches, "labels"),
        "first_batches": batches[:2],
    }}
    if "eval" in s:
        ev = s["eval"]["batches"]
        out["eval"] = {
            "batches": len(ev),
            "rows": [len(b) for b in ev],
            "input_ids_sha256": _rows_digest(ev, "input_ids"),
            "labels_sha256": _rows_digest(ev, "labels"),
            "first_batches": ev[:2],
        }
    return out


def reduce_reference(r: dict) -> dict:
    if "error" in r:
        return {"error": r["error"]}
    t = r["trainer"]
    figures = {k: t[k] for k in BANNER_FIGURES if k in t}
    figures["total_optimization_steps"] = t["total_optimization_steps"]
    orders = t.get("sampler", {}).get("orders", {})
    return {
        "train": _split(r["train"]),
        "eval": _split(r["eval"]),
        "banner": figures,
        "banner_lines": t["banner_lines"],
        "eval_banner_num_examples": (None if not r["eval"] else r["eval"]["num_examples"] if "examples" in r["eval"]
                                     else {name: v["num_examples"] for name, v in r["eval"].items()}),
        "sampler": {k.removeprefix("epoch"): v for k, v in orders.items()},
        **({"stream": _stream(r["stream"])} if "stream" in r else {}),
    }


def reduce_kiln(dump: dict, stdout: str) -> dict:
    t = dump["trainer"]
    lines = stdout.splitlines()
    start = lines.index("***** Running training *****")
    banner_lines = lines[start:start + 8]  # up to "Total optimization steps", as the reference's
    return {
        "train": _split(dump["train"]),
        "eval": _split(dump["eval"]),
        "banner": {
            "num_examples": t["num_examples"],
            "num_epochs": t["num_epochs"],
            "num_update_steps_per_epoch": t["num_update_steps_per_epoch"],
            "total_train_batch_size": t["total_train_batch_size"],
            "gradient_accumulation_steps": t["gradient_accumulation_steps"],
            "total_optimization_steps": t["max_steps"],
            "batches_per_epoch": t["batches_per_epoch"],
            "last_window_batches": t["last_window_batches"],
        },
        "banner_lines": banner_lines,
        "eval_banner_num_examples": t["eval_num_examples"],
        "sampler": {k: v for k, v in t["sampler"]["orders"].items()},
        **({"stream": _stream(dump["stream"])} if "stream" in dump else {}),
    }


def yaml_value(v) -> str:
    """As a YAML scalar that reads back with the same Python type (1.0 stays a float)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def run_kiln(pretrain: Path, kv: dict, workdir: Path) -> tuple[int, str, str, dict | None]:
    """kiln-pretrain --dry-run --dump-data on the fixture: (exit code, stdout, stderr, dump)."""
    kv = {k: v for k, v in kv.items() if k != "_error_key"}
    model = kv.pop("_model", "model")
    config = {"stage": "pt", "do_train": True, "finetuning_type": "full",
              "model_name_or_path": str(FIXTURE / model), "dataset_dir": str(FIXTURE / "data"),
              "output_dir": str(workdir / "out"), "overwrite_cache": False, **kv}
    yaml = "".join(f"{k}: {yaml_value(v)}\n" for k, v in config.items())
    (workdir / "case.yaml").write_text(yaml)
    dump = workdir / "dump.json"
    env = dict(os.environ, KILN_HOME=str(workdir / "home"))
    p = subprocess.run([str(pretrain), "--config", str(workdir / "case.yaml"), "--device", "cpu", "--dry-run",
                        "--dump-data", str(dump)], capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout, p.stderr, json.loads(dump.read_text()) if p.returncode == 0 else None


# The whole training runs compared: a file of fixtures/lf_parity each (its keys, LLaMA-Factory's log).
TRAINING_CASES = ("expected_training.json", "expected_training_streaming.json")


def training_reference(name: str = TRAINING_CASES[0]) -> dict:
    return json.loads((FIXTURE / name).read_text())


def run_kiln_training(pretrain: Path, workdir: Path,
                      ref: dict | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """kiln-pretrain on a training case (expected_training.json's by default): (process,
    trainer_state's log)."""
    ref = ref or training_reference()
    kv = {"dataset": "docs_a,docs_b", "report_to": "none", "overwrite_output_dir": True, **ref["keys"],
          **ref["defaults_of_the_script"]}
    config = {"stage": "pt", "do_train": True, "finetuning_type": "full",
              "model_name_or_path": str(FIXTURE / "model"), "dataset_dir": str(FIXTURE / "data"),
              "output_dir": str(workdir / "out"), **kv}
    (workdir / "train.yaml").write_text("".join(f"{k}: {yaml_value(v)}\n" for k, v in config.items()))
    env = dict(os.environ, KILN_HOME=str(workdir / "home"))
    p = subprocess.run([str(pretrain), "--config", str(workdir / "train.yaml"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300, env=env)
    log = json.loads((workdir / "out" / "trainer_state.json").read_text())["log_history"] if p.returncode == 0 else []
    return p, log


def live_training(python: str, ref: dict | None = None) -> list[dict]:
    """LLaMA-Factory's own run of a training case: its trainer_log.jsonl lines, reduced."""
    script = Path(__file__).resolve().parent / "llamafactory_reference.py"
    ref = ref or training_reference()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        subprocess.run([python, str(script), "--train-run", str(Path(tmp) / "run"), "--data", str(FIXTURE / "data"),
                        "--model", str(FIXTURE / "model"), "--output", str(out),
                        *(f"{k}={yaml_value(v)}" for k, v in ref["keys"].items())], check=True, timeout=1200,
                       stdout=subprocess.DEVNULL)
        lines = json.loads(out.read_text())["trainer_log.jsonl"]
    return [{k: e[k] for k in ("current_steps", "loss", "eval_loss", "lr", "epoch") if k in e} for e in lines]


def live_reference(python: str) -> dict:
    """Every case through LLaMA-Factory itself (one process): {name: reduced summary}."""
    script = Path(__file__).resolve().parent / "llamafactory_reference.py"
    with tempfile.TemporaryDirectory() as tmp:
        case_file = Path(tmp) / "cases.json"
        case_file.write_text(json.dumps(cases()))
        out = Path(tmp) / "ref.json"
        subprocess.run([python, str(script), "--cases", str(case_file), "--data", str(FIXTURE / "data"),
                        "--tokenizer", str(FIXTURE / "model"), "--output", str(out)], check=True, timeout=1200,
                       stdout=subprocess.DEVNULL)
        return {name: reduce_reference(r) for name, r in json.loads(out.read_text()).items()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-expected"]:
        sys.exit(__doc__)
    result = live_reference(sys.executable)
    (FIXTURE / "expected.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {FIXTURE / 'expected.json'}: {len(result)} cases")
    for name in TRAINING_CASES:
        training = training_reference(name)
        training["log"] = live_training(sys.executable, training)
        (FIXTURE / name).write_text(json.dumps(training, indent=1) + "\n")
        print(f"wrote {FIXTURE / name}: {len(training['log'])} log lines")
