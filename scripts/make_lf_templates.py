#!/usr/bin/env python3
"""Writes lib/kiln/train/hf/lf_templates.inc: what each of LLaMA-Factory 0.9.5's chat templates
does to a pretraining run (stage pt), read from its own TEMPLATES registry (llamafactory/data/
template.py): whether it replaces the tokenizer's EOS (replace_eos) and its stop words. That is all
stage pt takes from a template (Template.fix_special_tokens; data/processor/pretrain.py): the EOS
becomes stop_words[0] when replace_eos, the other stop words become special tokens, and the text
of each document is followed by the (new) EOS, or by "<|end_of_text|>" for the template llama3.

Run it with the LLaMA-Factory reference venv (scripts/setup_lf_reference.sh --print names it):
    ~/.cache/kiln/venv-lf/bin/python scripts/make_lf_templates.py [--check]
--check compares the file with what it would write (tests/python/test_lf_templates.py runs it).
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

OUT = Path(__file__).resolve().parents[1] / "lib" / "kiln" / "train" / "hf" / "lf_templates.inc"


def cxx(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render() -> str:
    import llamafactory
    from llamafactory.data.template import TEMPLATES

    lines = [
        f"// Written by scripts/make_lf_templates.py from LLaMA-Factory {llamafactory.__version__}'s TEMPLATES "
        "(llamafactory/data/template.py);",
        "// do not edit. Per template: name, replace_eos, stop words (lf_template.h says what stage pt takes).",
    ]
    for name in sorted(TEMPLATES):
        t = TEMPLATES[name]
        words = ", ".join(cxx(w) for w in t.stop_words)
        lines.append(f"{{{cxx(name)}, {'true' if t.replace_eos else 'false'}, {{{words}}}}},")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        if OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"{OUT} differs from LLaMA-Factory's TEMPLATES: run scripts/make_lf_templates.py")
        print(f"{OUT.name}: equal to LLaMA-Factory's TEMPLATES")
    else:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT} ({text.count(chr(10)) - 2} templates)")
