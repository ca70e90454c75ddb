"""The golden file of tests/data/test_numpy_random.cpp (fixtures/numpy_permutations.json) equals
what fixtures/make_numpy_permutations.py writes with the installed numpy, so the C++ test checks
kiln against numpy itself, not against a file that drifted from it (or was edited by hand). The
numpy version the file was written with is not compared: the streams are what must not change."""
import importlib.util
import json
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"


def load_script():
    spec = importlib.util.spec_from_file_location("make_numpy_permutations", FIXTURES / "make_numpy_permutations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixture_matches_installed_numpy():
    script = load_script()
    stored = json.loads((FIXTURES / "numpy_permutations.json").read_text())
    fresh = json.loads(script.dump(script.build()))
    assert stored["seeds"] == fresh["seeds"], f"numpy {np.__version__} disagrees with the stored fixture"
    assert stored["choices"] == fresh["choices"], f"numpy {np.__version__}: Generator.choice disagrees"


def test_fixture_covers_llamafactory_notes_vectors():
    # The test vectors of docs/llamafactory.md, section 2, are among the cases.
    stored = json.loads((FIXTURES / "numpy_permutations.json").read_text())
    perms = {(int(s["seed"]), c["n"]): c for s in stored["seeds"] for c in s["permutations"]}
    assert perms[(7, 380)]["perm"][:10] == [155, 297, 232, 34, 61, 225, 0, 257, 203, 361]
    assert perms[(42, 10)]["perm"] == [5, 6, 0, 7, 3, 2, 4, 9, 1, 8]


def test_hash_of_stored_permutations():
    # perm_hash itself, on the whole permutations the file holds (the C++ test hashes the same way).
    script = load_script()
    stored = json.loads((FIXTURES / "numpy_permutations.json").read_text())
    for s in stored["seeds"]:
        for case in s["permutations"]:
            if "perm" in case:
                assert case["hash"] == script.hex64(script.perm_hash(np.array(case["perm"], dtype=np.int64)))
