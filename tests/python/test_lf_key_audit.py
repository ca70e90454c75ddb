"""No LLaMA-Factory key silently ignored (issue #53, item 8).

Every field of the dataclasses LLaMA-Factory 0.9.5 parses a training YAML into (hparams/parser.py's
`_TRAIN_ARGS`: ModelArguments, DataArguments, TrainingArguments = transformers 5.6's
Seq2SeqTrainingArguments with LLaMA-Factory's additions, FinetuningArguments, GeneratingArguments)
must be a key kiln-pretrain acts on, accepts with a line (or at LLaMA-Factory's default only), or
refuses with a message: `kiln-pretrain --list-keys` says which, from the key tables
(lib/kiln/train/pretrain_config.cpp, lib/kiln/train/hf/lf_keys.cpp). A field in none of them would
be an "unknown key" error, and this test names it.

The field list is fixtures/lf_argument_fields.json, written by fixtures/make_lf_argument_fields.py
from the installed LLaMA-Factory (run it with the reference venv's python,
`scripts/setup_lf_reference.sh --print`), so the default tests need no LLaMA-Factory; the [slow]
test (KILN_SLOW_TESTS=1) runs the script again in that venv and checks the fixture equals it.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "fixtures" / "lf_argument_fields.json"
MAKER = HERE / "fixtures" / "make_lf_argument_fields.py"
LF_PYTHON = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln")) / "venv-lf" / "bin" / "python"
CLASSES = {"acted", "accepted", "refused"}


def lf_fields() -> dict:
    return json.loads(FIXTURE.read_text())["fields"]


@pytest.fixture(scope="module")
def kiln_keys(run_kiln) -> dict:
    r = run_kiln("kiln-pretrain", "--list-keys", timeout=60)
    assert r.returncode == 0, r.stderr
    keys = json.loads(r.stdout)
    assert set(keys.values()) <= CLASSES, set(keys.values())
    return keys


def test_fixture_is_llamafactory_095_training_arguments():
    data = json.loads(FIXTURE.read_text())
    assert (data["llamafactory"], data["transformers"]) == ("0.9.5", "5.6.0")
    fields = data["fields"]
    assert {f["dataclass"] for f in fields.values()} == {
        "ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments", "GeneratingArguments"}
    # One field of each, as LLaMA-Factory declares it.
    assert fields["disable_gradient_checkpointing"] == {"dataclass": "ModelArguments", "default": False}
    assert fields["neat_packing"] == {"dataclass": "DataArguments", "default": False}
    assert fields["warmup_ratio"] == {"dataclass": "TrainingArguments", "default": None}
    assert fields["stage"] == {"dataclass": "FinetuningArguments", "default": "sft"}
    assert fields["temperature"] == {"dataclass": "GeneratingArguments", "default": 0.95}
    assert len(fields) > 300


def test_every_llamafactory_field_is_acted_on_accepted_or_refused(kiln_keys):
    missing = sorted(k for k in lf_fields() if k not in kiln_keys)
    assert not missing, ("LLaMA-Factory 0.9.5 fields kiln neither acts on, accepts with a line, nor refuses "
                         f"(add them to lib/kiln/train/hf/lf_keys.cpp): {missing}")


def cli_value(value) -> str:
    """A default as a command line writes it (Python's repr for a float, YAML's true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def test_llamafactory_defaults_of_the_key_table_are_accepted(kiln_keys, run_kiln):
    """A YAML that writes out LLaMA-Factory's defaults (an exported config) is accepted: every key
    the table accepts only at a value, or refuses at every other value, takes LLaMA-Factory's own
    default. PretrainConfig's keys (acted) keep kiln's defaults: their LLaMA-Factory defaults would
    change this run (cutoff_len, dataset_dir, ...)."""
    args = []
    for key, field in lf_fields().items():
        default = field["default"]
        if kiln_keys.get(key) not in ("accepted", "refused"):
            continue
        if default is None or default in ("", [], {}):  # absent in a YAML: nothing to check
            continue
        args += [f"--{key}", cli_value(default)]
    assert len(args) // 2 > 150
    r = run_kiln("kiln-pretrain", "--config", "quickstart", "--dry-run", "--device", "cpu", *args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # Each key accepted with a line says so once, naming the key and where it was given.
    assert "command line: temperature: 0.95: a generation setting" in r.stdout + r.stderr


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")
@pytest.mark.skipif(not LF_PYTHON.exists(),
                    reason=f"no LLaMA-Factory reference venv at {LF_PYTHON}: run scripts/setup_lf_reference.sh")
def test_fixture_equals_the_installed_llamafactory():
    r = subprocess.run([str(LF_PYTHON), str(MAKER)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout) == json.loads(FIXTURE.read_text()), (
        f"LLaMA-Factory's fields changed: regenerate with {LF_PYTHON} {MAKER.relative_to(HERE.parents[1])} "
        f"> {FIXTURE.relative_to(HERE.parents[1])}")
