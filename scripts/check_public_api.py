#!/usr/bin/env python3
"""kiln calls LibTorch only through its public C++ API (docs/architecture.md, "LibTorch's public API").

Fails, naming file and line, when a source under lib/ or apps/:
  - declares a LibTorch symbol by hand: a weak declaration, a `namespace at|c10|torch|caffe2` block
    of its own, a TORCH_API declaration, or a symbol looked up with dlsym/dlopen;
  - uses LibTorch's impl/detail/internal/native namespaces (at::native::, c10::impl::,
    torch::autograd::impl::, at::detail:: ...) anywhere but lib/kiln/common/torch_internals.cpp, the
    one wrapper that holds the uses kiln cannot avoid, each with its comment and its test;
  - includes a LibTorch header that is not installed with LibTorch (checked against the include
    folders given with --torch-include), or one from an impl/native folder;
  - changes a process-wide setting (setenv, putenv, unsetenv, mallopt) outside
    lib/kiln/common/process_settings.cpp and lib/kiln/common/malloc_tuning.cpp, the opt-in functions
    that kiln's programs call and the library never does on its own.

`--self-test` first runs the checks on planted violations and fails unless each one is reported.
"""
import argparse
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
WRAPPER = "lib/kiln/common/torch_internals.cpp"
PROCESS_SETTINGS = {"lib/kiln/common/process_settings.cpp", "lib/kiln/common/malloc_tuning.cpp"}
SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc"}
LIBTORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]((?:ATen|c10|torch|caffe2)/[^>"]+)[>"]')

RULES = [
    # (name, regex, applies to (path) -> bool)
    ("weak declaration of a symbol", re.compile(r"__attribute__\s*\(\(\s*weak|#\s*pragma\s+weak"), lambda p: True),
    ("a block in a LibTorch namespace (a hand-written declaration)",
     re.compile(r"^\s*namespace\s+(at|c10|torch|caffe2)\b(\s*::\s*\w+)*\s*\{"), lambda p: True),
    ("a TORCH_API declaration (LibTorch's export macro) outside LibTorch", re.compile(r"\bTORCH_API\b"),
     lambda p: True),
    ("a symbol resolved by hand (dlsym/dlopen)", re.compile(r"\bdl(sym|open|vsym)\s*\("), lambda p: True),
    ("LibTorch's impl/detail/internal/native namespaces",
     re.compile(r"\b(at|c10|torch|caffe2)(\s*::\s*\w+)*\s*::\s*(impl|detail|internal|native)\s*::"),
     lambda p: p != WRAPPER),
    # The autograd graph's own machinery: the engine, the running node, a node's sequence number. The
    # public C++ API is torch::autograd::Function, grad/backward and a tensor's grad_fn.
    ("the autograd engine's internals (the running node, sequence numbers, Engine)",
     re.compile(r"\b(get_current_node|sequence_nr\s*\(|Engine::get_default_engine|gradient_edge)"),
     lambda p: p != WRAPPER),
    ("a process-wide setting outside common/process_settings.cpp",
     re.compile(r"\b(setenv|putenv|unsetenv|mallopt)\s*\("), lambda p: p not in PROCESS_SETTINGS),
]
FORBIDDEN_INCLUDE = re.compile(r"/(impl|native|detail)/")
# Headers of the autograd engine's internals (graph nodes and edges, the engine), allowed in the wrapper only.
INTERNAL_AUTOGRAD_HEADERS = re.compile(r"^torch/csrc/autograd/(function|engine|edge|graph_task|function_hook|variable)\.h$")


def strip_comments(line, in_block):
    """The code of one line with // and /* */ comments removed (string literals are not special:
    none of the patterns appear in kiln's strings)."""
    out, i = [], 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_block = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_block, i = True, i + 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_block


def check_file(path, rel, include_dirs, problems):
    in_block = False
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = LIBTORCH_INCLUDE.match(raw)
        if m:
            header = m.group(1)
            if FORBIDDEN_INCLUDE.search("/" + header) and rel != WRAPPER:
                problems.append(f"{rel}:{n}: includes {header}, from LibTorch's impl/native/detail folders")
            if INTERNAL_AUTOGRAD_HEADERS.match(header) and rel != WRAPPER:
                problems.append(f"{rel}:{n}: includes {header}, the autograd engine's internals")
            if include_dirs and not any((d / header).is_file() for d in include_dirs):
                problems.append(f"{rel}:{n}: includes {header}, which LibTorch does not install")
        code, in_block = strip_comments(raw, in_block)
        for name, regex, applies in RULES:
            if applies(rel) and regex.search(code):
                problems.append(f"{rel}:{n}: {name}: {raw.strip()}")


def scan(root, include_dirs):
    problems = []
    for top in ("lib", "apps"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                check_file(path, path.relative_to(root).as_posix(), include_dirs, problems)
    return problems


def self_test(include_dirs):
    planted = {
        "lib/kiln/ops/weak.cpp": "namespace at::native {\nvoid f() __attribute__((weak));\n}\n",
        "lib/kiln/ops/impl.cpp": "#include <c10/core/impl/LocalDispatchKeySet.h>\n"
                                 "void g() { c10::impl::ExcludeDispatchKeyGuard x(c10::autocast_dispatch_keyset); }\n",
        "lib/kiln/ops/detail.cpp": "auto gen = at::detail::getDefaultCPUGenerator();\n",
        "lib/kiln/ops/dl.cpp": "auto* f = dlsym(RTLD_DEFAULT, \"MKL_Set_Dynamic\");\n",
        "lib/kiln/ops/env.cpp": "void h() { setenv(\"OMP_NUM_THREADS\", \"1\", 1); }\n",
        "lib/kiln/ops/missing.cpp": "#include <ATen/native/mkldnn/Matmul.h>\n",
        "apps/export.cpp": "TORCH_API void mkldnn_matmul();\n",
        "lib/kiln/profile/node.cpp": "#include <torch/csrc/autograd/function.h>\n"
                                     "auto s = torch::autograd::get_current_node()->sequence_nr();\n",
        "lib/kiln/ops/fine.cpp": "// at::native::mkldnn_matmul was here (a comment)\n#include <ATen/ATen.h>\n"
                                 "namespace kiln::detail { int x; }\nint y = kiln::detail::x;\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for rel, text in planted.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        found = scan(root, include_dirs)
    expect = ["weak.cpp:1", "weak.cpp:2", "impl.cpp:1", "impl.cpp:2", "detail.cpp:1", "dl.cpp:1", "env.cpp:1",
              "missing.cpp:1", "export.cpp:1", "node.cpp:1", "node.cpp:2"]
    missed = [e for e in expect if not any(f"/{e}:" in "/" + p.split(" ")[0] for p in found)]
    false = [p for p in found if "fine.cpp" in p]
    if missed or false:
        print("check_public_api self-test failed: missed", missed, "wrongly flagged", false, file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch-include", action="append", default=[],
                    help="a LibTorch include folder (repeatable; ';'-separated lists accepted)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    include_dirs = [pathlib.Path(d) for arg in args.torch_include for d in arg.split(";") if d]
    if args.self_test and not self_test(include_dirs):
        return 1
    problems = scan(ROOT, include_dirs)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_public_api: {len(problems)} use(s) of LibTorch outside its public API (see {__file__})",
              file=sys.stderr)
        return 1
    where = ", ".join(str(d) for d in include_dirs) or "no include folder given: existence not checked"
    print(f"check_public_api: lib/ and apps/ use LibTorch's public API only (headers checked against {where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
