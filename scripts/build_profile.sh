#!/usr/bin/env bash
# Where a build's time went, from the build directory's Ninja log: the 20
# slowest steps, then the steps by kind (count, summed seconds, share of the
# summed step time):
#   torch TUs            objects whose compile command has libtorch's include
#                        path (torch/csrc/api/include or /torch/include)
#   torch-free TUs       the other objects (.o)
#   precompiled headers  .gch / .pch
#   links                executables, static (.a) and shared (.so) libraries
#   codegen              everything else: protobuf/gRPC sources, custom
#                        commands, the CMake re-run
# (objects missing from compile_commands.json get a row of their own).
# and the wall time (last end - first start) and the summed step time.
#
#   bash scripts/build_profile.sh            # $KAPPA_BUILD_DIR, default build/
#   bash scripts/build_profile.sh build-asan # relative to the repository root
#
# Reads BUILD_DIR/.ninja_log (v5: start ms, end ms, mtime, output, command
# hash, tab separated; the last line for an output wins; the outputs of one
# multi-output step, e.g. protoc's .pb.cc/.pb.h, count as one step) and
# BUILD_DIR/compile_commands.json (which objects include libtorch), and
# BUILD_DIR/build.ninja when present (link vs custom-command rules). Works on
# a build still in progress. Ninja restarts its clock at each invocation, so
# after incremental builds the wall time mixes runs (the script says so), and
# a ccache hit is timed as the look-up it was: the profile of a clean build
# with an empty cache is the one to read.
#
# Exit status: 0; 2 when the log is missing, empty or has no step lines.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-${KAPPA_BUILD_DIR:-build}}
PYTHON=python3
if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; fi
exec "$PYTHON" - "$BUILD_DIR" <<'EOF'
import json
import os
import re
import shlex
import sys

build_dir = sys.argv[1]
log_path = os.path.join(build_dir, ".ninja_log")
cc_path = os.path.join(build_dir, "compile_commands.json")
ninja_path = os.path.join(build_dir, "build.ninja")


def die(msg):
    print(f"build_profile: {msg}", file=sys.stderr)
    sys.exit(2)


# ---- the log: last entry per output ----
try:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
except OSError as e:
    die(f"cannot read {log_path}: {e.strerror} (build first: bash scripts/build.sh)")
if not lines:
    die(f"{log_path} is empty (no build step has finished yet)")
m = re.match(r"# ninja log v(\d+)", lines[0])
if not m:
    die(f"{log_path}: first line is not '# ninja log vN': {lines[0][:60]!r}")
if int(m.group(1)) < 5:
    die(f"{log_path}: log format v{m.group(1)}, want v5 or later")

latest = {}  # output -> (start_ms, end_ms, hash)
bad = 0
runs = 1
prev_end = None
for line in lines[1:]:
    fields = line.split("\t")
    if len(fields) < 5:
        bad += 1
        continue
    try:
        start, end = int(fields[0]), int(fields[1])
    except ValueError:
        bad += 1
        continue
    # Ninja appends steps as they finish, so within one invocation the end
    # times never decrease; a drop means a new invocation (its clock restarts).
    if prev_end is not None and end < prev_end:
        runs += 1
    prev_end = end
    output = fields[3]
    latest.pop(output, None)  # keep the order of the last occurrence
    latest[output] = (start, end, fields[4])
if not latest:
    die(f"{log_path} has no build steps")

# One step per (start, end, hash): a multi-output edge logs a line per output.
steps = {}
for output, (start, end, h) in latest.items():
    steps.setdefault((start, end, h), []).append(output)

# ---- compile_commands.json: output -> does the command include libtorch ----
real_build = os.path.realpath(build_dir)


def norm(path, directory):
    p = os.path.realpath(os.path.join(directory or real_build, path))
    rel = os.path.relpath(p, real_build)
    return p if rel.startswith("..") else rel


TORCH = re.compile(r"torch/csrc/api/include|/torch/include")
torch_of = {}
cc_note = None
try:
    with open(cc_path, encoding="utf-8") as f:
        entries = json.load(f)
except OSError as e:
    cc_note = f"{cc_path}: {e.strerror}; objects not told apart by libtorch"
    entries = []
except ValueError as e:
    cc_note = f"{cc_path}: not valid JSON ({e}); objects not told apart by libtorch"
    entries = []
for entry in entries:
    if "arguments" in entry:
        args = list(entry["arguments"])
        command = " ".join(args)
    else:
        command = entry.get("command", "")
        try:
            args = shlex.split(command)
        except ValueError:
            args = command.split()
    out = entry.get("output")
    if not out:
        for i, a in enumerate(args):
            if a == "-o" and i + 1 < len(args):
                out = args[i + 1]
                break
    if not out:
        continue
    torch_of[norm(out, entry.get("directory"))] = bool(TORCH.search(command))

# ---- build.ninja (optional): output -> rule, for links vs custom commands ----
rule_of = {}
try:
    with open(ninja_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("build "):
                continue
            # Outputs end at the first unescaped ':' ($: is an escaped colon).
            head = re.split(r"(?<!\$):", line[6:], maxsplit=1)
            if len(head) != 2:
                continue
            rule = head[1].split()[0] if head[1].split() else ""
            explicit = head[0].split(" | ")[0]
            for out in re.split(r"(?<!\$) ", explicit.strip()):
                if out and out != "|":
                    rule_of[out.replace("$ ", " ").replace("$:", ":").replace("$$", "$")] = rule
except OSError:
    pass

# ---- classify ----
KINDS = ["torch TUs", "torch-free TUs", "TUs without a compile command",
         "precompiled headers", "links", "codegen"]
LIB = re.compile(r"\.(a|so(\.\d+)*|dylib|lib|dll)$")
no_command = 0


def kind_of(output):
    global no_command
    rule = rule_of.get(output, "")
    base = os.path.basename(output)
    if base.endswith((".gch", ".pch")):
        return "precompiled headers"
    if "LINKER" in rule or "LIBRARY" in rule or LIB.search(base):
        return "links"
    if base.endswith((".o", ".obj")):
        key = norm(output, real_build)
        if key in torch_of:
            return "torch TUs" if torch_of[key] else "torch-free TUs"
        no_command += 1
        return "TUs without a compile command"
    if rule:
        return "codegen"  # CUSTOM_COMMAND, RERUN_CMAKE, ...
    # No build.ninja entry: an extension-less file is an executable.
    return "links" if "." not in base else "codegen"


rows = []  # (seconds, label, kind)
for (start, end, _), outputs in steps.items():
    label = outputs[0] if len(outputs) == 1 else f"{outputs[0]} (+{len(outputs) - 1} more)"
    rows.append(((end - start) / 1000.0, label, kind_of(outputs[0])))
total = sum(r[0] for r in rows)
wall = (max(e for (_, e, _) in steps) - min(s for (s, _, _) in steps)) / 1000.0


def pct(x):
    return f"{100.0 * x / total:5.1f}%" if total > 0 else "    -"


print(f"Build profile of {build_dir} ({len(rows)} steps in {log_path})")
if bad:
    print(f"  ({bad} unreadable line(s) skipped)")
print()
print("Slowest steps:")
print(f"  {'seconds':>8}  output")
for sec, label, _ in sorted(rows, key=lambda r: -r[0])[:20]:
    print(f"  {sec:8.1f}  {label}")
print()
print("By kind:")
print(f"  {'kind':<30} {'steps':>5} {'seconds':>9} {'share':>6}")
for k in KINDS:
    sel = [r[0] for r in rows if r[2] == k]
    if k == "TUs without a compile command" and not sel:
        continue
    print(f"  {k:<30} {len(sel):5d} {sum(sel):9.1f} {pct(sum(sel))}")
print()
print(f"Wall time:        {wall:9.1f} s ({wall / 60:.1f} min)")
print(f"Summed step time: {total:9.1f} s ({total / 60:.1f} min)"
      + (f", {total / wall:.2f} steps in parallel on average" if wall > 0 else ""))
if runs > 1:
    print("Note: the log holds steps of more than one ninja run (its clock restarts at "
          "each), so the wall time mixes them; profile a clean build for a true figure.")
if cc_note:
    print(f"Note: {cc_note}")
elif no_command:
    print(f"Note: {no_command} object(s) have no entry in {cc_path}")
EOF
