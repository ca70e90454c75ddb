"""Issue 29: a LLaMA-Factory YAML gives kiln the examples, banner figures and sample order that
LLaMA-Factory 0.9.5 (transformers 5.6.0, datasets 4.0.0) gives, token for token.

Reference: LLaMA-Factory's own pipeline (get_dataset, the pt collator, HF Trainer's step
arithmetic and sampler) run by tests/python/llamafactory_reference.py on a fixed fixture (two
datasets, a byte-level BPE tokenizer with EOS and no pad). The default test compares kiln with
the summaries that run stored in fixtures/lf_parity/expected.json (lf_parity.py says how to
regenerate them); the slow one (KILN_SLOW_TESTS=1) runs LLaMA-Factory live in its cached venv
(scripts/setup_lf_reference.sh, about 3 minutes the first time) and compares again.

Cases (fixtures/lf_parity/cases.json): a float and an integer val_size, val_size 1 (one
document), 1.0 (refused by both), packing left out / true (blocks of cutoff_len - 1) / false
(truncation), preprocessing_batch_size, preprocessing_num_workers 2, max_samples, a dataset
listed twice, data_seed, fractional epochs, max_steps, cutoff_len 16, 32 and 64; streaming:
true (issue 53, item 6) with dataloader_num_workers 1, 2 and 3, shuffle buffers of 16 to 100,
val_size 5, concat, interleave_under with probabilities, interleave_over, packing left out /
true / false, eval_dataset, max_steps crossing an epoch with and without a window cut by the
stream's end, and dataloader_num_workers 0 (refused by both): every train micro-batch of the run
and every eval batch, token for token, as LLaMA-Factory's own DataLoader gives them. Then whole
training runs (14 steps with one-batch windows, evaluations every 5 steps; and a streaming run of
60 steps whose step 56 joins two epochs' windows): every logged loss, learning rate and eval loss
as LLaMA-Factory's own run logged them.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import lf_parity

EXPECTED = json.loads((lf_parity.FIXTURE / "expected.json").read_text())
CASES = lf_parity.cases()


def compare(name: str, reference: dict, pretrain: Path, tmp_path: Path):
    code, out, err, dump = lf_parity.run_kiln(pretrain, CASES[name], tmp_path)
    if "error" in reference:
        assert code != 0, f"{name}: LLaMA-Factory refuses ({reference['error']}) but kiln ran"
        assert CASES[name]["_error_key"] in err, err  # the key that LLaMA-Factory's error is about
        return
    assert code == 0, f"{name}: kiln-pretrain failed:\n{err}"
    mine = lf_parity.reduce_kiln(dump, out)
    for key in ("banner", "banner_lines", "eval_banner_num_examples", "sampler"):
        assert mine[key] == reference[key], f"{name}: {key}"
    assert ("stream" in mine) == ("stream" in reference), f"{name}: streamed on one side only"
    if "stream" in reference:  # the DataLoader's batches, train (every micro-batch) and eval
        assert set(mine["stream"]) == set(reference["stream"]), f"{name}: stream parts"
        for part, ref in reference["stream"].items():
            for key in ref:
                assert mine["stream"][part][key] == ref[key], f"{name}: stream {part} {key}"
    for split in ("train", "eval"):
        assert (mine[split] is None) == (reference[split] is None), f"{name}: {split} split presence"
        if reference[split] is None:
            continue
        if split == "eval" and "num_examples" not in reference[split]:  # eval_on_each_dataset: by name
            assert mine[split] == reference[split], f"{name}: eval datasets"
            continue
        for key in ("num_examples", "total_tokens", "lengths", "first_examples", "input_ids_sha256",
                    "labels_sha256"):
            assert mine[split][key] == reference[split][key], f"{name}: {split} {key}"


def test_the_stored_reference_covers_every_case():
    assert set(EXPECTED) == set(CASES)
    # LLaMA-Factory (or datasets) refuses exactly the cases that name the key of their error.
    assert {n for n, r in EXPECTED.items() if "error" in r} == {n for n, c in CASES.items() if "_error_key" in c}
    # The quirks the cases are there for, as LLaMA-Factory produced them.
    assert EXPECTED["packing_true"]["train"]["lengths"] == [31]
    assert EXPECTED["packing_false"]["train"]["lengths"][0] == 1  # the empty document: its EOS alone
    assert EXPECTED["val_one_int_unpacked"]["eval"]["num_examples"] == 1
    assert EXPECTED["split_float"]["banner"]["last_window_batches"] == 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_kiln_matches_llamafactory(name, kiln_bin, tmp_path):
    compare(name, EXPECTED[name], kiln_bin("kiln-pretrain"), tmp_path)


def test_eos_is_not_scored_and_each_document_starts_without_bos():
    # The collator's rule, read off LLaMA-Factory's labels directly: -100 exactly at EOS (id 1).
    first = EXPECTED["split_float"]["train"]["first_examples"]
    for ex in first:
        assert [lab == -100 for lab in ex["labels"]] == [t == 1 for t in ex["input_ids"]]
        assert 0 not in ex["input_ids"]  # no BOS (id 0) anywhere


def compare_training(reference_log: list[dict], pretrain: Path, tmp_path: Path,
                     case: str = lf_parity.TRAINING_CASES[0]):
    """Same weights (the fixture's model), same examples and order, fp32 on the CPU: every step's
    loss, learning rate and epoch, and every evaluation's loss, as LLaMA-Factory logged them."""
    p, log = lf_parity.run_kiln_training(pretrain, tmp_path, lf_parity.training_reference(case))
    assert p.returncode == 0, p.stderr
    train = [e for e in log if "loss" in e]
    evals = [e for e in log if "eval_loss" in e]
    ref_train = [e for e in reference_log if "loss" in e]
    ref_eval = [e for e in reference_log if "eval_loss" in e]
    assert [e["step"] for e in train] == [e["current_steps"] for e in ref_train]
    for mine, ref in zip(train, ref_train):
        assert mine["loss"] == pytest.approx(ref["loss"], abs=2e-5), mine["step"]
        assert mine["learning_rate"] == pytest.approx(ref["lr"], rel=1e-9, abs=1e-12), mine["step"]
        assert mine["epoch"] == pytest.approx(ref["epoch"], rel=1e-12), mine["step"]
    # LLaMA-Factory's log also has the evaluation at the last step; kiln's log_history has it too.
    assert [e["step"] for e in evals] == [e["current_steps"] for e in ref_eval]
    for mine, ref in zip(evals, ref_eval):
        assert mine["eval_loss"] == pytest.approx(ref["eval_loss"], abs=2e-5), mine["step"]


def test_training_losses_match_llamafactorys_run(kiln_bin, tmp_path):
    # 76 blocks, batch 4, accumulation 3: 19 batches per epoch, so each epoch's 7th step is a
    # one-batch window normalised by its own num_items_in_batch.
    compare_training(lf_parity.training_reference()["log"], kiln_bin("kiln-pretrain"), tmp_path)


def test_streaming_training_losses_match_llamafactorys_run(kiln_bin, tmp_path):
    # streaming: true, 2 DataLoader workers, val_size 5, 60 steps of 4 batches: epoch 0's stream
    # has 223 batches, so step 56 joins its last 3-batch window (no optimizer step of its own)
    # with epoch 1's first window, each normalised by its own num_items_in_batch, and logs their
    # summed loss, as transformers' Trainer does with an iterable dataset.
    case = "expected_training_streaming.json"
    log = lf_parity.training_reference(case)["log"]
    assert max(e["loss"] for e in log if "loss" in e) > 10  # the joined step, in LLaMA-Factory's own log
    compare_training(log, kiln_bin("kiln-pretrain"), tmp_path, case)


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="slow: set KILN_SLOW_TESTS=1")
def test_kiln_matches_live_llamafactory(kiln_bin, tmp_path):
    setup = Path(__file__).resolve().parents[2] / "scripts" / "setup_lf_reference.sh"
    subprocess.run(["bash", str(setup)], check=True, timeout=1800)  # idempotent: 0.5 s when ready
    python = subprocess.run(["bash", str(setup), "--print"], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    live = lf_parity.live_reference(python)
    for name in sorted(CASES):
        work = tmp_path / name
        work.mkdir()
        compare(name, live[name], kiln_bin("kiln-pretrain"), work)
    for case in lf_parity.TRAINING_CASES:
        (tmp_path / case).mkdir()
        live_log = lf_parity.live_training(python, lf_parity.training_reference(case))
        compare_training(live_log, kiln_bin("kiln-pretrain"), tmp_path / case, case)
