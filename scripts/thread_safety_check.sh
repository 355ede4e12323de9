#!/usr/bin/env bash
# Makes a missing lock a build error: reruns the main build's compile
# commands (BUILD_DIR/compile_commands.json, the libtorch build) with
# clang++ -fsyntax-only and only its thread-safety analysis on, as errors
# (-Wthread-safety -Wthread-safety-beta -Werror=thread-safety; the beta set
# checks ABSL_ACQUIRED_AFTER/BEFORE lock orders). g++ ignores the
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations; clang checks
# them. Every other warning is off (-Wno-everything): the main build owns
# those, and libtorch's headers are not clang-clean.
#
#   bash scripts/thread_safety_check.sh            # after scripts/build.sh
#
# Checked translation units: the sources under rollout_worker/, learner/,
# services/, teacher_server/ and verifier/ (not tests) that use absl::Mutex or
# its annotations, or include a header of theirs that does (the code that can
# touch guarded state). Those directories must not use std::mutex or
# std::condition_variable: the analysis cannot see them (docs/contributing.md).
# Before the sources, a canary with a missing lock must fail, so a clang or
# abseil that silently stopped checking fails this script rather than passing
# it. scripts/sanitize.sh runs it in its address mode (CI).
#
# Environment: KAPPA_BUILD_DIR (default build), CLANGXX (default clang++-14,
# then clang++), KAPPA_JOBS (parallel clang runs, default 2).
# Exit status: 0 clean, 1 a thread-safety error (or a forbidden std::mutex,
# or a canary that passed), 2 no compile_commands.json or no clang++.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${KAPPA_BUILD_DIR:-build}
DB="$BUILD_DIR/compile_commands.json"
DIRS=(rollout_worker learner services teacher_server verifier)
FLAGS=(-fsyntax-only -Wno-everything -Wthread-safety -Wthread-safety-beta
  -Werror=thread-safety)

if [[ ! -f "$DB" ]]; then
  echo "thread_safety_check: no $DB (run scripts/build.sh first)" >&2
  exit 2
fi
if [[ -z ${CLANGXX:-} ]]; then
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null; then
      CLANGXX=$candidate
      break
    fi
  done
fi
if [[ -z ${CLANGXX:-} ]] || ! command -v "$CLANGXX" >/dev/null; then
  echo "thread_safety_check: no clang++ (scripts/setup.sh installs clang)" >&2
  exit 2
fi

# std::mutex and friends escape the analysis, so they are not allowed here.
# (Comment lines may name them.)
forbidden=$(grep -rnE 'std::(mutex|timed_mutex|recursive_mutex|shared_mutex|condition_variable)\b|std::(lock_guard|unique_lock|scoped_lock)\b' \
  --include='*.cc' --include='*.h' "${DIRS[@]}" | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [[ -n $forbidden ]]; then
  echo "thread_safety_check: use absl::Mutex with ABSL_GUARDED_BY (docs/contributing.md), not:" >&2
  echo "$forbidden" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The canary: an unguarded read must be reported, or nothing below is checked.
cat >"$work/canary.cc" <<'EOF'
#include "absl/synchronization/mutex.h"
class Canary {
 public:
  int Read() const { return value_; }  // no lock: must be an error
 private:
  mutable absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};
int main() { return Canary().Read(); }
EOF
if "$CLANGXX" -std=gnu++17 "${FLAGS[@]}" "$work/canary.cc" >"$work/canary.log" 2>&1 ||
  ! grep -q "requires holding mutex" "$work/canary.log"; then
  echo "thread_safety_check: $CLANGXX did not reject a missing lock; the check is not working:" >&2
  cat "$work/canary.log" >&2
  exit 1
fi

# One shell script per translation unit: its compile command with clang++,
# without the output and dependency-file flags and the warning flags.
python3 - "$DB" "$PWD" "$work" "$CLANGXX" "${FLAGS[*]}" "${DIRS[@]}" <<'EOF'
import json, os, re, shlex, sys

db_path, root, work, clangxx, flags, *dirs = sys.argv[1:]
MARK = re.compile(r"absl::Mutex\b|ABSL_GUARDED_BY|ABSL_PT_GUARDED_BY|absl/synchronization/mutex\.h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

def text(path, cache={}):
    if path not in cache:
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                cache[path] = f.read()
        except OSError:
            cache[path] = ""
    return cache[path]

def pch_header_follows(argv, index):  # `-include .../cmake_pch.hxx` (cmake/torch_pch.cmake)
    return index + 1 < len(argv) and argv[index + 1].endswith("cmake_pch.hxx")

def marked(path):
    return bool(MARK.search(text(path)))

def includes(path):  # the project headers `path` includes directly
    return [h for h in INCLUDE.findall(text(path)) if os.path.isfile(os.path.join(root, h))]

def closure(path):
    found, todo = set(), [path]
    while todo:
        for header in includes(todo.pop()):
            if header not in found:
                found.add(header)
                todo.append(header)
    return found

entries = {}
for entry in json.load(open(db_path)):
    rel = os.path.relpath(os.path.normpath(os.path.join(entry["directory"], entry["file"])), root)
    if rel.split(os.sep)[0] in dirs and rel.endswith(".cc") and rel not in entries:
        entries[rel] = entry
# A source is checked when it or a header it includes directly uses absl::Mutex
# or its annotations; a marked header none of those includes (say a header-only
# class, included through another header) by the first source that reaches it.
chosen = [rel for rel in entries if marked(rel) or any(marked(h) for h in includes(rel))]
covered = set().union(*(closure(rel) for rel in chosen)) if chosen else set()
for rel in entries:
    reached = {h for h in closure(rel) if marked(h)} - covered
    if reached and rel not in chosen:
        chosen.append(rel)
        covered |= closure(rel)

count = 0
for rel in chosen:
    entry = entries[rel]
    source = os.path.join(root, rel)
    argv = entry.get("arguments") or shlex.split(entry["command"])
    # A launcher (ccache) in front of the compiler: drop it too.
    while argv and os.path.basename(argv[0]) in ("ccache", "sccache"):
        argv = argv[1:]
    args, skip = [], 0
    for arg_index, arg in enumerate(argv[1:], start=1):
        if skip:
            skip -= 1
            continue
        if arg in ("-o", "-MF", "-MT", "-MQ"):
            skip = 1
        elif arg == "-include" and pch_header_follows(argv, arg_index):
            # A g++ build's precompiled <torch/torch.h>: clang cannot read
            # it. A clang build's (-Xclang -include-pch ...) is kept: the
            # check then parses no libtorch header at all.
            skip = 1
        elif arg in ("-c", "-MD", "-MMD") or os.path.normpath(os.path.join(entry["directory"], arg)) == source:
            pass
        elif re.match(r"-W(?![alp],)", arg) or arg in ("-pedantic", "-pedantic-errors"):
            pass  # warnings: only the thread-safety ones below
        else:
            args.append(arg)
    command = [clangxx, *args, *flags.split(), source]
    with open(os.path.join(work, f"{count:04d}.sh"), "w") as f:
        f.write(f"cd {shlex.quote(entry['directory'])} && echo {shlex.quote(rel)} && "
                f"exec {shlex.join(command)}\n")
    count += 1
print(f"thread_safety_check: {count} translation units: {' '.join(chosen)}")
EOF

shopt -s nullglob
units=("$work"/[0-9]*.sh)
if ((${#units[@]} == 0)); then
  echo "thread_safety_check: no translation units selected from $DB" >&2
  exit 1
fi
start=$SECONDS
# Each unit's diagnostics go to its own log, printed whole on failure.
status=0
# shellcheck disable=SC2016  # $1 is the inner sh's argument
printf '%s\n' "${units[@]}" |
  xargs -P "${KAPPA_JOBS:-2}" -I{} sh -c 'sh "$1" >"$1.log" 2>&1 || mv "$1.log" "$1.failed"' _ {} ||
  status=$?
failed=("$work"/*.failed)
for log in "${failed[@]}"; do
  cat "$log" >&2
done
if ((${#failed[@]} > 0 || status != 0)); then
  echo "thread_safety_check: ${#failed[@]} of ${#units[@]} translation units failed" \
    "(-Wthread-safety; docs/contributing.md)" >&2
  exit 1
fi
echo "thread_safety_check: ${#units[@]} translation units clean ($((SECONDS - start)) s)"
