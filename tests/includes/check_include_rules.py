#!/usr/bin/env python3
"""The build's three include rules (issues 37 and 40; docs/contributing.md, "Includes").

1. No header of the project includes <torch/torch.h>: a header that did would
   make every file including it parse the whole of libtorch's API. Headers
   include what they use (<ATen/core/Tensor.h>, <torch/types.h>,
   <torch/nn/module.h>, ...); only .cc files may include <torch/torch.h>.
2. No source of a torch-free target (proto, services but its torch codec,
   tasks, verifier, the tokenizers, their tests: every target CMake found not
   to compile against libtorch, listed in BUILD/torch_free_sources.txt by
   cmake/torch_pch.cmake) reaches a libtorch header (torch/, ATen/, c10/,
   caffe2/), directly or through the project headers it includes. Debian's
   libtorch headers are on the default include path, so the compiler would
   not stop it; the sanitizer and fuzz builds (KAPPA_TORCH=OFF) rely on it.
3. No include runs up a floor or across to another room: a file in one of
   the LAYER directories includes project headers only of its own directory
   and of the directories its LAYER names (the table KAPPA_LAYERS in the
   top-level CMakeLists.txt, given here as arguments "dir:dep dep ..."). A
   directory the table does not name (tests/, bench/) may include anything.

Usage: check_include_rules.py ROOT TORCH_FREE_SOURCES_TXT [LAYER ...]
Exit status: 0 the rules hold; 1 a rule is broken (every offender is
printed: the include chain that reaches libtorch, or the file and the
include that runs up); 2 bad arguments.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
TORCH_PREFIXES = ("torch/", "ATen/", "c10/", "caffe2/")
SKIP_DIRS = {".git", "node_modules", ".cache", "runs"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class Includes:
    """The #include lines of the project's files, read once each."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def of(self, path):
        if path not in self.cache:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = strip_comments(f.read())
            except OSError:
                text = ""
            self.cache[path] = INCLUDE.findall(text)
        return self.cache[path]

    def project_header(self, name, including_file):
        """The project file an #include "name" or <name> names, or None."""
        for base in (os.path.dirname(including_file), self.root):
            candidate = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(candidate) and candidate.startswith(self.root + os.sep):
                return candidate
        return None

    def torch_chain(self, path):
        """The include chain from `path` to a libtorch header, or None."""
        seen = {path}
        todo = [(path, [os.path.relpath(path, self.root)])]
        while todo:
            current, chain = todo.pop()
            for _, name in self.of(current):
                if name.startswith(TORCH_PREFIXES):
                    return chain + [f"<{name}>"]
                header = self.project_header(name, current)
                if header and header not in seen:
                    seen.add(header)
                    todo.append((header, chain + [os.path.relpath(header, self.root)]))
        return None


def project_headers(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for name in filenames:
            if name.endswith((".h", ".hpp", ".cuh")):
                yield os.path.join(dirpath, name)


def parse_layers(specs):
    """{directory: set of directories it may include} from "dir:dep dep ..."."""
    layers = {}
    for spec in specs:
        directory, sep, deps = spec.partition(":")
        if not sep or not directory.strip():
            raise ValueError(f"bad layer {spec!r}: expected DIR:DEP DEP ...")
        layers[directory.strip()] = set(deps.split())
    unknown = sorted(d for deps in layers.values() for d in deps if d not in layers)
    if unknown:
        raise ValueError(f"layers name undeclared directories: {', '.join(unknown)}")
    return layers


def layer_problems(root, layers, includes):
    """Rule 3: every include of a project header from a layer directory into
    a directory it may not use, as "file: includes "x" (why)"."""
    problems = []
    for directory in sorted(layers):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, directory)):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for name in sorted(filenames):
                if not name.endswith((".h", ".cc", ".cuh", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                for _, included in includes.of(path):
                    target = included.split("/", 1)[0]
                    if "/" not in included or target not in layers or target == directory:
                        continue
                    if target not in layers[directory]:
                        allowed = " ".join(sorted(layers[directory])) or "nothing"
                        problems.append(
                            f"{os.path.relpath(path, root)}: includes \"{included}\" (rule 3: "
                            f"{directory}/ may include only {allowed})")
    return problems


def main(argv):
    if len(argv) < 3:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    try:
        layers = parse_layers(argv[3:])
    except ValueError as e:
        print(f"check_include_rules: {e}", file=sys.stderr)
        return 2
    root = os.path.realpath(argv[1])
    try:
        with open(argv[2], encoding="utf-8") as f:
            torch_free = [line.strip() for line in f if line.strip()]
    except OSError as e:
        print(f"check_include_rules: cannot read {argv[2]}: {e.strerror} "
              "(cmake writes it at configure time)", file=sys.stderr)
        return 2
    includes = Includes(root)
    problems = []

    for header in sorted(project_headers(root)):
        for _, name in includes.of(header):
            if name == "torch/torch.h":
                problems.append(f"{os.path.relpath(header, root)}: includes <torch/torch.h> "
                                "(rule 1: a header includes only the libtorch headers it uses)")

    checked = 0
    for source in sorted(set(torch_free)):
        source = os.path.realpath(source)
        if not source.startswith(root + os.sep) or not os.path.isfile(source):
            continue  # generated (protobuf) sources live in the build directory
        checked += 1
        chain = includes.torch_chain(source)
        if chain:
            problems.append(f"{chain[0]}: a torch-free target's source reaches libtorch "
                            f"(rule 2): {' -> '.join(chain)}")

    problems += layer_problems(root, layers, includes)

    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"check_include_rules: {len(problems)} broken include rule(s)", file=sys.stderr)
        return 1
    if checked == 0:
        print(f"check_include_rules: no torch-free source found in {argv[2]}", file=sys.stderr)
        return 1
    print(f"check_include_rules: no header includes <torch/torch.h>; {checked} torch-free "
          f"sources reach no libtorch header; {len(layers)} layer directories include "
          "nothing above them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
