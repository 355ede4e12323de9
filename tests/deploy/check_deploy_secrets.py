#!/usr/bin/env python3
"""scripts/deploy_secrets.sh, run into temporary directories:

  * the certificate chains to the CA (`openssl verify -CAfile ca.crt
    tls.crt`), is not a CA itself, matches tls.key, has extendedKeyUsage
    serverAuth AND clientAuth (one certificate for servers and, under mutual
    TLS, clients), and its SANs name every gRPC server name the manifests
    dial: the Compose services with an --address flag, the k8s Services of
    deploy/k8s/base, localhost and IP 127.0.0.1 (health checks);
  * worker.token and observer.token are 64 hex digits without a newline and
    differ; grafana_admin_password is at least 24 characters;
  * ca.key is not in OUT_DIR (a mount of it would carry it) but in OUT_DIR-ca,
    mode 0600;
  * permissions: as root, OUT_DIR and its files belong to 10001:10001,
    OUT_DIR 0750, certificates 0444, key/tokens/password 0440; --private:
    0700, certificates 0644, the rest 0600; not root (run as nobody through
    setpriv when this test runs as root): 0755 and 0644 with a warning;
  * an existing OUT_DIR is refused without --force (and left as it was);
    --force replaces it with new tokens; --san adds a name.

usage: check_deploy_secrets.py REPO_ROOT
"""
import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import yaml

errors = []


def fail(msg):
    errors.append(msg)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def dialled_names(repo):
    """Compose services with a gRPC listener, and the k8s Services."""
    names = set()
    for path in glob.glob(os.path.join(repo, "deploy", "compose", "docker-compose*.yml")):
        for name, svc in (yaml.safe_load(open(path)).get("services") or {}).items():
            command = [str(c) for c in (svc or {}).get("command") or []]
            if "--address" in command:
                names.add(name)
    for path in glob.glob(os.path.join(repo, "deploy", "k8s", "base", "*.yaml")):
        for doc in yaml.safe_load_all(open(path)):
            if doc and doc.get("kind") == "Service":
                names.add(doc["metadata"]["name"])
    return names


def x509_ext(path):
    r = run(["openssl", "x509", "-in", path, "-noout", "-ext",
             "subjectAltName,extendedKeyUsage,basicConstraints"])
    if r.returncode != 0:
        fail(f"openssl x509 {path}: {r.stderr}")
    return r.stdout


def check_certificate(out, want_dns, extra=()):
    ca, crt, key = (os.path.join(out, f) for f in ("ca.crt", "tls.crt", "tls.key"))
    r = run(["openssl", "verify", "-CAfile", ca, crt])
    if r.returncode != 0 or not r.stdout.strip().endswith("OK"):
        fail(f"openssl verify -CAfile ca.crt tls.crt: {r.stdout}{r.stderr}")
    text = x509_ext(crt)
    sans = set(re.findall(r"(?:DNS|IP Address):[^,\s]+", text))
    want = {f"DNS:{n}" for n in want_dns} | {"DNS:localhost", "IP Address:127.0.0.1"} | set(extra)
    if not want <= sans:
        fail(f"tls.crt: SANs lack {sorted(want - sans)} (has {sorted(sans)})")
    m = re.search(r"Extended Key Usage:\s*\n\s*(.+)", text)
    ekus = {e.strip() for e in m.group(1).split(",")} if m else set()
    for eku in ("TLS Web Server Authentication", "TLS Web Client Authentication"):
        if eku not in ekus:
            fail(f"tls.crt: extendedKeyUsage lacks {eku} (has {sorted(ekus)})")
    if "CA:FALSE" not in text:
        fail("tls.crt: basicConstraints is not CA:FALSE")
    pub = [run(["openssl", "x509", "-in", crt, "-noout", "-pubkey"]).stdout,
           run(["openssl", "pkey", "-in", key, "-pubout"]).stdout]
    if not pub[0] or pub[0] != pub[1]:
        fail("tls.key is not the key of tls.crt")


def check_tokens(out):
    tokens = {}
    for name in ("worker.token", "observer.token"):
        with open(os.path.join(out, name), "rb") as f:
            data = f.read()
        if not re.fullmatch(rb"[0-9a-f]{64}", data):
            fail(f"{name}: {len(data)} bytes, not 64 hex digits without a newline")
        tokens[name] = data
    if len(set(tokens.values())) != 2:
        fail("worker.token and observer.token are equal")
    with open(os.path.join(out, "grafana_admin_password"), "rb") as f:
        pw = f.read()
    if len(pw) < 24 or pw != pw.strip():
        fail(f"grafana_admin_password: {len(pw)} characters or surrounding whitespace")
    return tokens


def mode(path):
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def check_modes(out, want_dir, want_cert, want_secret, owner=None, label=""):
    files = {"ca.crt": want_cert, "tls.crt": want_cert, "tls.key": want_secret,
             "worker.token": want_secret, "observer.token": want_secret,
             "grafana_admin_password": want_secret}
    got = set(os.listdir(out))
    if got != set(files):
        fail(f"{label}: OUT_DIR holds {sorted(got)}, want {sorted(files)}")
    for path, want in [(out, want_dir)] + [(os.path.join(out, f), m) for f, m in files.items()]:
        if not os.path.exists(path):
            continue
        m, uid, gid = mode(path)
        if m != want:
            fail(f"{label}: {path} mode {oct(m)}, want {oct(want)}")
        if owner is not None and (uid, gid) != owner:
            fail(f"{label}: {path} owned by {uid}:{gid}, want {owner[0]}:{owner[1]}")
    ca_dir = out + "-ca"
    if os.path.exists(os.path.join(out, "ca.key")):
        fail(f"{label}: ca.key is inside OUT_DIR")
    if not os.path.isfile(os.path.join(ca_dir, "ca.key")):
        fail(f"{label}: no {ca_dir}/ca.key")
    else:
        if mode(ca_dir)[0] != 0o700 or mode(os.path.join(ca_dir, "ca.key"))[0] != 0o600:
            fail(f"{label}: {ca_dir} is not 0700 with ca.key 0600")


def main():
    repo = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "."
    script = os.path.join(repo, "scripts", "deploy_secrets.sh")
    names = dialled_names(repo)
    for must in ("learner", "teacher", "verifier", "learner-peers"):
        if must not in names:
            fail(f"the manifests no longer name {must}: update this test")
    tmp = tempfile.mkdtemp(prefix="kappa-secrets-test-")
    try:
        # Default mode (root here: files for uid 10001; else world-readable).
        out = os.path.join(tmp, "default", "secrets")
        r = run(["bash", script, out])
        if r.returncode != 0:
            fail(f"deploy_secrets.sh {out}: exit {r.returncode}: {r.stderr}")
            raise SystemExit
        check_certificate(out, names)
        tokens = check_tokens(out)
        if os.geteuid() == 0:
            check_modes(out, 0o750, 0o444, 0o440, owner=(10001, 10001), label="as root")
        else:
            check_modes(out, 0o755, 0o644, 0o644, label="not root")
            if "WARNING" not in r.stderr:
                fail("not root: no warning that the files are world-readable")

        # Refuses to overwrite; --force replaces.
        r = run(["bash", script, out])
        if r.returncode == 0 or "--force" not in r.stderr:
            fail(f"a second run without --force did not refuse: exit {r.returncode} {r.stderr}")
        if check_tokens(out) != tokens:
            fail("a refused run changed the tokens")
        r = run(["bash", script, "--force", "--san", "DNS:learner.kappa.svc", out])
        if r.returncode != 0:
            fail(f"--force: exit {r.returncode}: {r.stderr}")
        else:
            new = check_tokens(out)
            if new["worker.token"] == tokens["worker.token"]:
                fail("--force kept the old worker.token")
            check_certificate(out, names, extra=["DNS:learner.kappa.svc"])

        # --private: the invoking user's files, 0600.
        out = os.path.join(tmp, "private", "secrets")
        r = run(["bash", script, "--private", out])
        if r.returncode != 0:
            fail(f"--private: exit {r.returncode}: {r.stderr}")
        else:
            check_certificate(out, names)
            check_tokens(out)
            check_modes(out, 0o700, 0o644, 0o600, owner=(os.geteuid(), os.getegid()),
                        label="--private")

        # As root, also the path of a user who cannot chown: run as nobody.
        setpriv = shutil.which("setpriv")
        if os.geteuid() == 0 and setpriv:
            base = os.path.join(tmp, "nobody")
            os.makedirs(base)
            os.chown(base, 65534, 65534)
            os.chmod(tmp, 0o755)
            out = os.path.join(base, "secrets")
            # A copy nobody can reach, wherever the repository lives.
            copy = shutil.copy(script, os.path.join(tmp, "deploy_secrets.sh"))
            os.chmod(copy, 0o755)
            r = run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                     "bash", copy, out], cwd=tmp)
            if r.returncode != 0:
                fail(f"as nobody: exit {r.returncode}: {r.stderr}")
            else:
                check_modes(out, 0o755, 0o644, 0o644, owner=(65534, 65534), label="as nobody")
                if "WARNING" not in r.stderr:
                    fail("as nobody: no warning that the files are world-readable")
        elif os.geteuid() == 0:
            print("note: setpriv not found; the non-root path is not exercised")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: deploy_secrets.sh (SANs cover {', '.join(sorted(names))}, localhost, 127.0.0.1)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit as e:
        if e.code is None:
            for err in errors:
                print("FAIL:", err)
            sys.exit(1)
        raise
