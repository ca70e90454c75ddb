#!/usr/bin/env python3
"""The include graph between lib/kiln's directories, and the check that it runs one way.

kiln reads top-down (docs/architecture.md, "Layers"): each directory may include only from the
directories below it in LAYERS. A layer is a path below lib/kiln, most often a top directory
("ops"); a deeper path is a layer of its own inside its parent ("train/hf", the HF and
LLaMA-Factory files, sits below "train", the loop), and a file belongs to the longest layer path
that holds it. The script prints every edge (directory -> directory, with the
files that make it) and fails, naming file and line, on an include that runs up a layer, sideways
within one, or into a directory a rule keeps out (the cost models take kernel choices as data and
never include ops/ or kernels/). A directory missing from LAYERS fails too, so a new one gets a
place before it gets code.

  scripts/check_layers.py              the graph, then the verdict (CTest `layers`)
  scripts/check_layers.py --self-test  first plants violations and fails unless each is reported
"""
import argparse
import collections
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Bottom to top. "." is lib/kiln itself: export.h and version.h at the bottom; the umbrella header
# kiln.h and api.cpp at the very top (the "api" pseudo-directory). report/ is the generic tables,
# charts and report files (no kiln types) that kiln-profile's reports render with. Inside train/: the settings
# struct (its public header, which keeps its installed path kiln/train/pretrain_config.h), then the
# HF / LLaMA-Factory file writers and key table (train/hf), then the training loop (the rest). Inside
# profile/: the measurements (profile/counters: hardware counters, component times), then the sweep
# and the reports that use them (the rest).
LAYERS = ["base", "common", "config", "io", "report", "kernels", "ops", "model", "cost", "data", "optim", "dist",
          "train/pretrain_config.h", "train/hf", "train", "profile/counters", "profile", "api"]
# Edges the order would allow but the design does not: the cost models depend only on the model's
# config (and common); ops fills in the kernel choices they take.
FORBIDDEN = {("cost", "ops"), ("cost", "kernels"), ("cost", "data"), ("cost", "optim"), ("cost", "dist")}
TOP_FILES = {"kiln.h", "api.cpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"kiln/([^"]+)"')
SUFFIXES = {".h", ".cpp", ".cu", ".cuh", ".inc"}


def layer_of(rel):
    """The layer of a path relative to lib/kiln ("ops/rope.h" -> "ops", "train/hf/tensorboard.h" ->
    "train/hf", "kiln.h" -> "api"): the longest layer path holding it, else its top directory."""
    parts = pathlib.PurePosixPath(rel).parts
    if len(parts) == 1:
        return "api" if parts[0] in TOP_FILES else "base"
    for n in range(len(parts), 1, -1):
        if "/".join(parts[:n]) in LAYERS:
            return "/".join(parts[:n])
    return parts[0]


def scan(lib):
    """(edges {(from, to): [file:line -> header]}, violations [text])."""
    edges, problems = collections.defaultdict(list), []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for path in sorted(lib.rglob("*")):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(lib).as_posix()
        src = layer_of(rel)
        if src not in rank:
            problems.append(f"lib/kiln/{rel}: directory '{src}' has no place in LAYERS (scripts/check_layers.py)")
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            dst = layer_of(m.group(1))
            if dst == src:
                continue
            edges[(src, dst)].append(f"{rel}:{number} -> kiln/{m.group(1)}")
            where = f"lib/kiln/{rel}:{number}: includes kiln/{m.group(1)}"
            if dst not in rank:
                problems.append(f"{where}: directory '{dst}' has no place in LAYERS")
            elif (src, dst) in FORBIDDEN:
                problems.append(f"{where}: {src} must not depend on {dst} (scripts/check_layers.py, FORBIDDEN)")
            elif rank[dst] > rank[src]:
                problems.append(f"{where}: runs up from {src} to {dst} (layers, bottom to top: {' < '.join(LAYERS)})")
    return edges, problems


def print_graph(edges):
    print("include graph of lib/kiln (directory -> directories it includes), bottom to top:")
    by_src = collections.defaultdict(list)
    for (src, dst), sites in edges.items():
        by_src[src].append((dst, len(sites)))
    rank = {name: i for i, name in enumerate(LAYERS)}
    for src in sorted(by_src, key=lambda s: rank.get(s, len(LAYERS))):
        targets = sorted(by_src[src], key=lambda t: rank.get(t[0], len(LAYERS)))
        print(f"  {src:23} -> " + ", ".join(f"{dst} ({n})" for dst, n in targets))


def self_test():
    plants = {
        "ops/x.h": '#include "kiln/train/trainer.h"\n',  # up
        "cost/y.cpp": '#include "kiln/ops/linear.h"\n',  # forbidden although below
        "common/z.cpp": '#include "kiln/kiln.h"\n',  # up to the umbrella
        "newdir/w.h": "int w;\n",  # unplaced directory
        "train/hf/v.cpp": '#include "kiln/train/trainer_internal.h"\n',  # a writer reaching up into the loop
        "train/pretrain_config.h": '#include "kiln/train/hf/run_outputs.h"\n',  # the settings up to the writers
        "profile/counters/u.cpp": '#include "kiln/profile/sweep.h"\n',  # the counters up to the sweep
    }
    with tempfile.TemporaryDirectory() as tmp:
        lib = pathlib.Path(tmp)
        for rel, text in plants.items():
            (lib / rel).parent.mkdir(parents=True, exist_ok=True)
            (lib / rel).write_text(text)
        (lib / "model").mkdir()
        (lib / "model" / "ok.cpp").write_text('#include "kiln/ops/rope.h"\n#include "kiln/export.h"\n')
        # Down the nested layers: the loop to the writers and the settings, the writers to the settings.
        (lib / "train" / "ok.cpp").write_text('#include "kiln/train/hf/run_outputs.h"\n'
                                              '#include "kiln/train/pretrain_config.h"\n')
        (lib / "train" / "hf" / "ok.cpp").write_text('#include "kiln/train/pretrain_config.h"\n'
                                                     '#include "kiln/optim/adamw.h"\n')
        (lib / "profile" / "ok.cpp").write_text('#include "kiln/profile/counters/counters.h"\n')
        _, problems = scan(lib)
    missing = [rel for rel in plants if not any(f"lib/kiln/{rel}:" in p for p in problems)]
    wrong = [p for p in problems if "/ok.cpp" in p]
    if missing or wrong:
        print(f"check_layers self-test failed: not reported {missing}, wrongly reported {wrong}")
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--lib", type=pathlib.Path, default=ROOT / "lib" / "kiln")
    args = parser.parse_args()
    if args.self_test and not self_test():
        return 1
    edges, problems = scan(args.lib)
    print_graph(edges)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers")
        return 1
    print(f"no upward edge: {' < '.join(LAYERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
