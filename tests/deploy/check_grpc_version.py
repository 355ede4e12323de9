#!/usr/bin/env python3
"""The gRPC the images install is the one docs/security.md documents.

Reads every versioned `libgrpc++X.Y` package the Dockerfiles under
deploy/docker install and the section "## gRPC version and known CVEs" of
docs/security.md, and fails unless
  * all Dockerfiles install one and the same libgrpc++X.Y;
  * the section names exactly that package (`libgrpc++X.Y`) and "gRPC X.Y";
  * the section still discusses CVE-2023-33953 and CVE-2023-4785.
So a gRPC bump in a Dockerfile fails this test until someone has re-read
the CVE section (which CVEs still apply, which mitigations are needed).

usage: check_grpc_version.py REPO_ROOT
"""
import glob
import os
import re
import sys

SECTION = "## gRPC version and known CVEs"
CVES = ("CVE-2023-33953", "CVE-2023-4785")
PACKAGE = re.compile(r"libgrpc\+\+(\d+\.\d+)")


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    errors = []
    pinned = {}
    for path in sorted(glob.glob(os.path.join(repo, "deploy", "docker", "Dockerfile*"))):
        if path.endswith(".dockerignore"):
            continue
        versions = set(PACKAGE.findall(open(path).read()))
        if len(versions) != 1:
            errors.append(f"{path}: installs libgrpc++ versions {sorted(versions)}, want exactly one")
        pinned[os.path.relpath(path, repo)] = versions
    all_versions = set().union(*pinned.values()) if pinned else set()
    if not pinned:
        errors.append("no Dockerfile under deploy/docker")
    elif len(all_versions) != 1:
        errors.append(f"the Dockerfiles disagree on libgrpc++: {pinned}")

    doc_path = os.path.join(repo, "docs", "security.md")
    text = open(doc_path).read()
    start = text.find("\n" + SECTION + "\n")
    if start < 0:
        errors.append(f"{doc_path}: no section '{SECTION}'")
        section = ""
    else:
        rest = text[start + 1 + len(SECTION):]
        end = re.search(r"^## ", rest, re.M)
        section = rest[:end.start()] if end else rest
    documented = set(PACKAGE.findall(section))
    if section and documented != all_versions:
        errors.append(f"{doc_path} '{SECTION}' names libgrpc++ {sorted(documented)}, the Dockerfiles "
                      f"install {sorted(all_versions)}: review which CVEs apply to the new "
                      f"version and update the section")
    for v in all_versions:
        if section and f"gRPC {v}" not in section:
            errors.append(f"{doc_path} '{SECTION}' does not say 'gRPC {v}'")
    for cve in CVES:
        if section and cve not in section:
            errors.append(f"{doc_path} '{SECTION}' no longer discusses {cve}")
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: gRPC {', '.join(sorted(all_versions))} in {', '.join(pinned)} = docs/security.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
