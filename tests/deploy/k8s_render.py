#!/usr/bin/env python3
"""Renders a kustomize target of deploy/k8s offline, with secrets.

deploy/k8s/base generates Secret kappa-secrets from base/secrets/, which is
gitignored and filled by scripts/deploy_secrets.sh, so the source tree does
not render as is. This copies deploy/k8s (without any secrets/ or
secrets-ca/ directory found there: real keys are not copied) into a
temporary directory, runs scripts/deploy_secrets.sh into its base/secrets,
and runs `kubectl kustomize` on the copy. The source tree is not written.

    python3 tests/deploy/k8s_render.py REPO_ROOT overlays/gpu [--kubectl PATH]

prints the rendered YAML (exit status of kubectl kustomize). check_k8s.py
imports render_all().
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SECRET_DIRS = ("secrets", "secrets-ca")


def secured_copy(repo, tmp):
    """Copies deploy/k8s into tmp/k8s and generates base/secrets there."""
    src = os.path.join(repo, "deploy", "k8s")
    dst = os.path.join(tmp, "k8s")
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in SECRET_DIRS])
    script = os.path.join(repo, "scripts", "deploy_secrets.sh")
    r = subprocess.run(["bash", script, "--private", os.path.join(dst, "base", "secrets")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{script} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return dst


# ctest's SKIP_RETURN_CODE for these tests (tests/deploy/CMakeLists.txt).
SKIP_RETURN_CODE = 77
MIN_KUBECTL = (1, 27)


def require_kubectl(kubectl):
    """Exits 77 (ctest: skipped) with a 'SKIPPED: ...' line naming what is
    missing when `kubectl` is absent or older than MIN_KUBECTL (its built-in
    kustomize renders components and secretGenerator options from 1.27 on;
    Debian 12's kubernetes-client is 1.20, so setup.sh cannot install one).
    scripts/skipped_tests.sh lists the line at the end of every test run."""
    want = "kubectl >= %d.%d" % MIN_KUBECTL
    path = shutil.which(kubectl)
    if path is None:
        print(f"SKIPPED: {want} is not on PATH (not a Debian package: "
              "https://kubernetes.io/docs/tasks/tools/)", flush=True)
        raise SystemExit(SKIP_RETURN_CODE)
    r = subprocess.run([path, "version", "--client", "-o", "json"], capture_output=True,
                       text=True)
    import json
    try:
        client = json.loads(r.stdout)["clientVersion"]
        version = (int(client["major"]), int(re.sub(r"\D.*", "", client["minor"])))
    except (ValueError, KeyError):
        version = (0, 0)
    if version < MIN_KUBECTL:
        print(f"SKIPPED: {path} is {version[0]}.{version[1]}; these checks need {want}",
              flush=True)
        raise SystemExit(SKIP_RETURN_CODE)


def kustomize(kubectl, path):
    return subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)


def render_all(repo, targets, kubectl="kubectl"):
    """{target: rendered YAML text} for each target (e.g. "overlays/gpu")."""
    with tempfile.TemporaryDirectory(prefix="kappa-k8s-") as tmp:
        k8s = secured_copy(repo, tmp)
        out = {}
        for target in targets:
            r = kustomize(kubectl, os.path.join(k8s, target))
            if r.returncode != 0:
                raise SystemExit(f"kubectl kustomize {target}: {r.stderr}")
            out[target] = r.stdout
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("target", help="path under deploy/k8s, e.g. overlays/cpu-demo")
    ap.add_argument("--kubectl", default="kubectl")
    args = ap.parse_args()
    require_kubectl(args.kubectl)
    with tempfile.TemporaryDirectory(prefix="kappa-k8s-") as tmp:
        k8s = secured_copy(args.repo, tmp)
        r = kustomize(args.kubectl, os.path.join(k8s, args.target))
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
