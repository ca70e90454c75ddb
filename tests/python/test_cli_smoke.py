"""The programs' command lines. kiln-smoke end to end: the loss falls on the synthetic language,
and bad arguments fail with a message that names the source, the key and the value (exit code 2),
never a crash. Every program: a word no key takes, or a key of another mode, is refused by name
(a parser that set it aside, or a mode that ignored it, would drop it silently). The settings
readers themselves: tests/apps/test_settings.cpp."""
import math
import re
from pathlib import Path

import pytest


def test_smoke_run_learns(run_kiln):
    out = run_kiln("kiln-smoke", "--steps", "40")
    assert out.returncode == 0, out.stderr
    first, last = map(float, re.search(r"loss (\S+) -> (\S+)", out.stdout).groups())
    assert math.isclose(first, math.log(320), rel_tol=0.05)  # untrained: uniform over the vocabulary
    assert last < 0.5 * first


def test_bad_arguments_are_named(run_kiln):
    out = run_kiln("kiln-smoke", "--dtype", "fp8")
    assert out.returncode == 2 and "command line: key 'dtype'" in out.stderr and "'fp8'" in out.stderr
    out = run_kiln("kiln-smoke", "--model", "no-such-model")
    assert out.returncode == 2 and "no-such-model" in out.stderr and "tiny" in out.stderr
    out = run_kiln("kiln-smoke", "--steps", "abc")
    assert out.returncode == 2 and "steps" in out.stderr


def test_a_word_no_option_takes_is_refused_by_every_app(run_kiln, tmp_path):
    # A parser that keeps such words aside (cxxopts did) loses them silently: `--input a.txt b.txt` (a shell glob) would tokenize
    # only a.txt, `--prompt Once upon a time` would continue "Once". Each app must stop, naming it.
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "b.txt").write_text("two\n")
    b = str(tmp_path / "b.txt")
    calls = [
        (b, ("kiln-tokenize", "--bench", "--input", tmp_path / "a.txt", b)),
        ("upon", ("kiln-generate", "--model", tmp_path, "--prompt", "Once", "upon")),
        ("stray", ("kiln-eval", "--model", tmp_path, "stray")),
        ("stray", ("kiln-hf", "inspect", "--in", tmp_path / "a.txt", "stray")),
        ("stray", ("kiln-bench", "--ops", "rmsnorm", "stray")),
        ("stray", ("kiln-smoke", "--steps", "1", "stray")),
        ("stray", ("kiln-profile", "sweep", "--model", "tiny", "stray")),
    ]
    for word, call in calls:
        out = run_kiln(*call)
        assert out.returncode == 2, (call, out.stdout, out.stderr)
        assert f"unexpected argument '{word}'" in out.stderr, (call, out.stderr)


def test_docs_embedding_shows_the_tested_service():
    """docs/embedding.md's example is tests/consumer/service.cpp, the file the consumer test builds."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs/embedding.md").read_text()
    assert (root / "tests/consumer/service.cpp").read_text() in doc


def test_kiln_hf_refuses_an_option_its_command_does_not_read(run_kiln, tmp_path):
    # train ran without --kernels/--autocast/--fused-loss/--grads (forward's options) and said nothing.
    d = str(tmp_path)
    for command, args, bad in [("train", ["--model", d, "--kernels", "aten"], "kernels"),
                               ("train", ["--model", d, "--grads"], "grads"),
                               ("inspect", ["--in", d, "--out", "x"], "out"),
                               ("convert", ["--model", d, "--batch", "b.safetensors"], "batch")]:
        out = run_kiln("kiln-hf", command, *args)
        assert out.returncode == 2, out.stderr
        assert f"key '{bad}': does not apply to {command}" in out.stderr, out.stderr


@pytest.mark.parametrize("call, words", [
    (("kiln-tokenize", "--decode", "ids.jsonl", "--input", "a.txt"), "key 'input': does not apply to decode"),
    (("kiln-tokenize", "--bench", "--input", "a.txt", "--output", "o"), "key 'output_dir': does not apply to bench"),
    (("kiln-tokenize", "--bench", "--input", "a.txt", "--add-special-tokens"),
     "key 'add_special_tokens': does not apply to bench"),
    (("kiln-tokenize", "--input", "a.txt", "--output", "o", "--repeat", "3"),
     "key 'repeat': does not apply to tokenizing"),
    (("kiln-tokenize", "--default-corpus", "--decode", "ids.jsonl"), "not both"),
    (("kiln-bench", "--ops", "rmsnorm", "--seqlens", "128"), "key 'seqlens': applies to ops attention"),
    (("kiln-bench", "--ops", "rmsnorm", "--comm-max-bytes", "1048576"),
     "key 'comm_max_bytes': applies to ops comm"),
])
def test_an_option_of_another_mode_is_refused(run_kiln, call, words):
    out = run_kiln(*call)
    assert out.returncode == 2 and words in out.stderr, out.stderr
