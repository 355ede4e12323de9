#!/usr/bin/env python3
"""Structure of deploy/docker/Dockerfile and Dockerfile.cuda (no Docker engine
needed): a build stage and a runtime stage; the CPU build stage installs
exactly scripts/setup.sh's PACKAGES, the build set (`setup.sh build`, what
scripts/demo.sh installs; not TEST_PACKAGES or FUZZ_PACKAGES, which only
`setup.sh test` adds), the CUDA one the same minus libtorch-dev, which would
shadow the CUDA libtorch; the build COPYs every source directory
the top-level CMakeLists.txt adds (but tests/) and builds kappa_suite; the
runtime stage is a slim Debian, copies all five binaries and the entrypoint,
ends as a non-root USER and has an ENTRYPOINT.

usage: check_dockerfile.py REPO_ROOT
"""
import re
import shlex
import sys

BINARIES = ["kappa-learner", "kappa-teacher", "kappa-verifier", "kappa-rollout-worker", "kappa"]
errors = []


def fail(msg):
    errors.append(msg)


def instructions(path):
    """[(INSTRUCTION, argument text)] with line continuations joined, comments dropped."""
    out, buf = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and (line.strip().startswith("#") or not line.strip()):
                continue
            if buf and line.strip().startswith("#"):
                continue
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def stages(instrs):
    result = []  # [(base image, name, [instrs])]
    for ins, arg in instrs:
        if ins == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            result.append((m.group(1), m.group(2), []))
        elif result:
            result[-1][2].append((ins, arg))
    return result


def setup_packages(path):
    text = open(path).read()
    m = re.search(r"^PACKAGES=\((.*?)\)", text, re.S | re.M)
    if not m:
        raise SystemExit(f"{path}: no PACKAGES=( ... ) list")
    return [w for line in m.group(1).splitlines() for w in shlex.split(line, comments=True)]


def apt_packages(run_text):
    pkgs = []
    for m in re.finditer(r"apt-get install ([^&;|]*)", run_text):
        pkgs += [w for w in shlex.split(m.group(1)) if not w.startswith("-")]
    return pkgs


def cmake_source_dirs(path):
    text = open(path).read()
    dirs = set()
    # add_subdirectory(dir), and include(dir/file.cmake) (not a module such
    # as include(CTest)): both must be copied.
    found = re.findall(r"add_subdirectory\(\s*([^\s)]+)", text)
    found += re.findall(r"\binclude\(\s*([^\s)$]+/[^\s)]+)", text)
    for d in found:
        top = d.split("/")[0]
        if top != "tests":
            dirs.add(top)
    return dirs


def check(path, repo, expected_packages, cuda):
    instrs = instructions(path)
    st = stages(instrs)
    name = path.split("/")[-1]
    if len(st) < 2:
        fail(f"{name}: want a build stage and a runtime stage, got {len(st)} stage(s)")
        return
    build, runtime = st[0], st[-1]
    if not build[0].startswith("debian:bookworm") or build[0].startswith("debian:bookworm-slim"):
        fail(f"{name}: build stage FROM {build[0]}, want debian:bookworm")
    if runtime[0] != "debian:bookworm-slim":
        fail(f"{name}: runtime stage FROM {runtime[0]}, want debian:bookworm-slim")
    if not build[1]:
        fail(f"{name}: the build stage has no name (FROM ... AS build)")

    build_runs = " ".join(a for i, a in build[2] if i == "RUN")
    pkgs = apt_packages(build_runs)
    if cuda:
        extra = set(pkgs) - set(expected_packages)
        missing = [p for p in expected_packages if p not in pkgs]
        allowed_missing = {"libtorch-dev"}
        if set(missing) - allowed_missing:
            fail(f"{name}: build stage lacks setup.sh packages {sorted(set(missing) - allowed_missing)}")
        if "libtorch-dev" in pkgs:
            fail(f"{name}: installs libtorch-dev (the CPU libtorch) next to the CUDA one")
        if "cuda-toolkit-${CUDA_PKG_VERSION}" not in extra:
            fail(f"{name}: build stage does not install cuda-toolkit-${{CUDA_PKG_VERSION}}")
        if "LIBTORCH_URL" not in build_runs or "CMAKE_PREFIX_PATH=/opt/libtorch" not in build_runs:
            fail(f"{name}: build stage does not fetch LIBTORCH_URL and point CMake at it")
    else:
        if pkgs != expected_packages:
            only_s = [p for p in expected_packages if p not in pkgs]
            only_d = [p for p in pkgs if p not in expected_packages]
            fail(f"{name}: build-stage packages differ from scripts/setup.sh's PACKAGES "
                 f"(only in setup.sh: {only_s}; only in Dockerfile: {only_d}; "
                 f"or the order differs)")
    copied = set()
    for i, a in build[2]:
        if i == "COPY":
            for src in shlex.split(a)[:-1]:
                if not src.startswith("--"):
                    copied.add(src.rstrip("/"))
    want_dirs = cmake_source_dirs(f"{repo}/CMakeLists.txt")
    if "CMakeLists.txt" not in copied:
        fail(f"{name}: build stage does not COPY CMakeLists.txt")
    for d in sorted(want_dirs - copied):
        fail(f"{name}: build stage does not COPY {d}/ (added by CMakeLists.txt)")
    if "--target kappa_suite" not in build_runs:
        fail(f"{name}: build stage does not build --target kappa_suite")
    if "KAPPA_BUILD_TESTS=OFF" not in build_runs:
        fail(f"{name}: build stage builds the tests (-DKAPPA_BUILD_TESTS=OFF)")

    rt = runtime[2]
    rt_text = " ".join(a for _, a in rt)
    for b in BINARIES:
        if not any(i == "COPY" and "--from=" in a and re.search(rf"/{re.escape(b)}(\s|$)", a)
                   for i, a in rt):
            fail(f"{name}: runtime stage does not COPY --from the build stage binary {b}")
    if not any(i == "COPY" and "deploy/docker/entrypoint.sh" in a for i, a in rt):
        fail(f"{name}: runtime stage does not COPY deploy/docker/entrypoint.sh")
    if "-dev" in " ".join(apt_packages(" ".join(a for i, a in rt if i == "RUN"))):
        fail(f"{name}: runtime stage installs -dev packages")
    users = [a for i, a in rt if i == "USER"]
    if not users:
        fail(f"{name}: runtime stage has no USER (runs as root)")
    else:
        user = users[-1].split(":")[0]
        if user in ("root", "0") or user != "10001":
            fail(f"{name}: final USER is {users[-1]}, want 10001")
        last_user = max(k for k, (i, _) in enumerate(rt) if i == "USER")
        if any(i == "RUN" for i, _ in rt[last_user + 1:]):
            fail(f"{name}: RUN after the final USER")
    if "useradd --uid 10001" not in rt_text:
        fail(f"{name}: runtime stage does not create user uid 10001")
    entry = [a for i, a in rt if i == "ENTRYPOINT"]
    if not entry or "kappa-entrypoint" not in entry[-1]:
        fail(f"{name}: ENTRYPOINT is not /usr/local/bin/kappa-entrypoint")
    if "not found" not in rt_text:
        fail(f"{name}: runtime stage does not check ldd for missing libraries")


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    expected = setup_packages(f"{repo}/scripts/setup.sh")
    check(f"{repo}/deploy/docker/Dockerfile", repo, expected, cuda=False)
    check(f"{repo}/deploy/docker/Dockerfile.cuda", repo, expected, cuda=True)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: Dockerfile and Dockerfile.cuda ({len(expected)} setup.sh packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
