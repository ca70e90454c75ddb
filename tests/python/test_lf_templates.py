"""Issue 53: kiln's table of LLaMA-Factory's templates (lib/kiln/train/hf/lf_templates.inc) equals
LLaMA-Factory 0.9.5's own TEMPLATES registry, read in its venv by scripts/make_lf_templates.py
--check. Skipped where that venv is absent (scripts/setup_lf_reference.sh makes it)."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln")) / "venv-lf" / "bin" / "python"


@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="no LLaMA-Factory venv (scripts/setup_lf_reference.sh)")
def test_template_table_equals_llamafactorys():
    p = subprocess.run([str(VENV_PYTHON), str(ROOT / "scripts" / "make_lf_templates.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr + p.stdout
