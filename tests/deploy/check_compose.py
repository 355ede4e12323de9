#!/usr/bin/env python3
"""Structure of the Compose deployment, on the RENDERED config
(`docker-compose -f ... config`) of each file combination:

  * the kappa services (bootstrap, learner, teacher, verifier, rollout) and
    prometheus, grafana exist; every image has an explicit tag, not latest;
  * rollout is scalable: no container_name, no published ports;
  * every healthcheck is a CMD running a kappa binary with --health-check
    on the service's own gRPC port;
  * depends_on: learner and teacher wait for bootstrap with
    service_completed_successfully (bootstrap: restart "no"); rollout waits
    for learner, teacher and verifier with service_healthy; every
    service_healthy target has a healthcheck;
  * every kappa service mounts deploy/compose/kappa.yaml read-only at
    /etc/kappa/kappa.yaml, passes --config /etc/kappa/kappa.yaml, and the
    named volumes at /data and /runs; listen flags bind 0.0.0.0;
  * the /metrics ports are the ones deploy/prometheus/prometheus.yml
    scrapes; rollout's peers are dns:///SERVICE:PORT of a service listening
    there; prometheus and grafana mount deploy/prometheus and deploy/grafana;
  * secure by default: every kappa service has the security settings in
    its environment (TLS, mutual TLS, certificate files, its worker token,
    the tokens directory, all under /etc/kappa/secrets) and mounts
    deploy/compose/secrets read-only at /etc/kappa/secrets; every published
    port (Prometheus, Grafana) binds 127.0.0.1; Grafana has no anonymous
    access and reads its admin password from a mounted secrets file;
  * with a GPU file: learner and teacher reserve exactly one nvidia device
    entry each; with the 2-rank file, KAPPA_WORLD_SIZE matches the learner
    ranks and their KAPPA_RANKs are 0..R-1.

usage: check_compose.py REPO_ROOT [--docker-compose PATH]
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

from secure_env import SECRETS, SECURITY_ENV

COMBOS = [
    ["docker-compose.yml"],
    ["docker-compose.yml", "docker-compose.gpu.yml"],
    ["docker-compose.yml", "docker-compose.gpu-dp2.yml"],
]
KAPPA = ["bootstrap", "learner", "teacher", "verifier", "rollout"]
BINARY = {"learner": "kappa-learner", "teacher": "kappa-teacher", "verifier": "kappa-verifier"}
GRAFANA_PASSWORD = "/run/secrets/grafana_admin_password"
errors = []


def fail(combo, msg):
    errors.append(f"[{' + '.join(combo)}] {msg}")


def render(dc, compose_dir, files):
    cmd = [dc] + sum((["-f", os.path.join(compose_dir, f)] for f in files), []) + ["config"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {r.stderr}")
    return yaml.safe_load(r.stdout)


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None


def volumes(svc):
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            out.append((v.get("source"), v["target"], v.get("read_only", False)))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def prometheus_targets(path):
    cfg = yaml.safe_load(open(path))
    targets = {}
    for job in cfg["scrape_configs"]:
        for sc in job.get("static_configs") or []:
            for t in sc["targets"]:
                host, port = t.rsplit(":", 1)
                targets[host] = int(port)
        for sd in job.get("dns_sd_configs") or []:
            for n in sd["names"]:
                targets[n] = int(sd["port"])
    return targets


def published(port):
    """(host ip, host port, container port) of a rendered `ports:` entry."""
    if isinstance(port, dict):
        return (str(port.get("host_ip") or ""), str(port.get("published") or ""),
                str(port.get("target")))
    parts = str(port).split("/")[0].split(":")
    if len(parts) == 3:
        return tuple(parts)
    if len(parts) == 2:
        return ("", parts[0], parts[1])
    return ("", "", parts[0])


def truthy(value):
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def listen_port(cmd, flag_name):
    value = flag(cmd, flag_name)
    if value is None:
        return None
    m = re.fullmatch(r"(.+):(\d+)", value)
    return (m.group(1), int(m.group(2))) if m else None


def check(combo, cfg, repo):
    services = cfg.get("services") or {}
    compose_dir = os.path.join(repo, "deploy", "compose")
    for name in KAPPA + ["prometheus", "grafana"]:
        if name not in services:
            fail(combo, f"service {name} missing")
    if errors:
        return
    for name, svc in services.items():
        image = str(svc.get("image", ""))
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        if not tag or tag == "latest":
            fail(combo, f"{name}: image '{image}' has no explicit tag")
    ro = services["rollout"]
    if "container_name" in ro:
        fail(combo, "rollout has a container_name (cannot --scale)")
    if ro.get("ports"):
        fail(combo, "rollout publishes ports (cannot --scale)")

    named = set((cfg.get("volumes") or {}).keys())
    ports = {}  # service -> {grpc, metrics}
    for name in [n for n in services if n in KAPPA or n.startswith("learner-")]:
        svc = services[name]
        cmd = [str(c) for c in svc.get("command") or []]
        if flag(cmd, "--config") != "/etc/kappa/kappa.yaml":
            fail(combo, f"{name}: command lacks --config /etc/kappa/kappa.yaml")
        vols = volumes(svc)
        cfg_mount = [v for v in vols if v[1] == "/etc/kappa/kappa.yaml"]
        if not cfg_mount:
            fail(combo, f"{name}: does not mount the config at /etc/kappa/kappa.yaml")
        else:
            src, _, read_only = cfg_mount[0]
            if os.path.realpath(src) != os.path.realpath(os.path.join(compose_dir, "kappa.yaml")):
                fail(combo, f"{name}: config mount source {src} is not deploy/compose/kappa.yaml")
            if not read_only:
                fail(combo, f"{name}: config mounted read-write")
        for target in ("/data", "/runs"):
            if not any(v[1] == target and v[0] in named for v in vols):
                fail(combo, f"{name}: no named volume at {target}")
        env = svc.get("environment") or {}
        if env.get("KAPPA_CFG_DATA_DIR") != "/data":
            fail(combo, f"{name}: KAPPA_CFG_DATA_DIR is not /data")
        for key, value in SECURITY_ENV.items():
            if str(env.get(key)) != value:
                fail(combo, f"{name}: {key} is {env.get(key)!r}, not {value!r}")
        secrets = [v for v in vols if v[1] == SECRETS]
        if not secrets:
            fail(combo, f"{name}: does not mount the secrets at {SECRETS}")
        else:
            src, _, read_only = secrets[0]
            if os.path.realpath(src or "") != os.path.realpath(os.path.join(compose_dir, "secrets")):
                fail(combo, f"{name}: {SECRETS} is mounted from {src}, not deploy/compose/secrets")
            if not read_only:
                fail(combo, f"{name}: {SECRETS} mounted read-write")
        for fl in ("--address", "--metrics-address"):
            lp = listen_port(cmd, fl)
            if lp and lp[0] != "0.0.0.0":
                fail(combo, f"{name}: {fl} binds {lp[0]}, not 0.0.0.0")
        ports[name] = {"grpc": (listen_port(cmd, "--address") or (None, None))[1],
                       "metrics": (listen_port(cmd, "--metrics-address") or (None, None))[1]}

    for name, svc in services.items():
        hc = svc.get("healthcheck")
        if not hc or hc.get("disable"):
            continue
        test = [str(t) for t in hc.get("test") or []]
        if not test or test[0] != "CMD" or "--health-check" not in test:
            fail(combo, f"{name}: healthcheck is not [CMD, <kappa binary>, --health-check, ADDR]: {test}")
            continue
        base = name.split("-")[0]
        if BINARY.get(base) != test[1]:
            fail(combo, f"{name}: healthcheck runs {test[1]}, want {BINARY.get(base)}")
        addr = flag(test, "--health-check")
        if addr != f"127.0.0.1:{ports.get(name, {}).get('grpc')}":
            fail(combo, f"{name}: healthcheck probes {addr}, not its own gRPC port")
    for name in ("learner", "teacher", "verifier"):
        if not services[name].get("healthcheck"):
            fail(combo, f"{name}: no healthcheck")

    def deps(name):
        return {d: (c or {}).get("condition", "service_started")
                for d, c in (services[name].get("depends_on") or {}).items()}

    for name in [n for n in services if n in ("learner", "teacher") or n.startswith("learner-")]:
        if deps(name).get("bootstrap") != "service_completed_successfully":
            fail(combo, f"{name}: does not depend on bootstrap with service_completed_successfully")
    if str(services["bootstrap"].get("restart", "no")) != "no":
        fail(combo, "bootstrap: restart is not \"no\" (a one-shot)")
    for peer in ("learner", "teacher", "verifier"):
        if deps("rollout").get(peer) != "service_healthy":
            fail(combo, f"rollout: does not depend on {peer} with service_healthy")
    for name in services:
        for dep, cond in deps(name).items():
            if dep not in services:
                fail(combo, f"{name}: depends on unknown service {dep}")
            elif cond == "service_healthy" and not services[dep].get("healthcheck"):
                fail(combo, f"{name}: waits for {dep} healthy, but {dep} has no healthcheck")

    # /metrics ports = what Prometheus scrapes; rollout's peers.
    targets = prometheus_targets(os.path.join(repo, "deploy", "prometheus", "prometheus.yml"))
    for host, port in targets.items():
        if host in ports and ports[host]["metrics"] != port:
            fail(combo, f"{host}: /metrics on {ports[host]['metrics']}, prometheus.yml scrapes {port}")
    for name in ("learner", "teacher", "verifier", "rollout"):
        if name not in targets:
            fail(combo, f"prometheus.yml does not scrape {name}")
    rcmd = [str(c) for c in ro.get("command") or []]
    for peer in ("learner", "teacher", "verifier"):
        addr = flag(rcmd, f"--{peer}")
        m = re.fullmatch(r"dns:///([^:]+):(\d+)", addr or "")
        if not m:
            fail(combo, f"rollout: --{peer} {addr} is not dns:///SERVICE:PORT")
        elif m.group(1) not in ports or ports[m.group(1)]["grpc"] != int(m.group(2)):
            fail(combo, f"rollout: --{peer} {addr}: no service listens there")

    pvols = [v[1] for v in volumes(services["prometheus"])]
    for f in ("prometheus.yml", "rules.yml"):
        if f"/etc/prometheus/{f}" not in pvols:
            fail(combo, f"prometheus: does not mount {f}")
    gvols = {v[1]: v[0] for v in volumes(services["grafana"])}
    for target, src in (("/etc/grafana/provisioning", "deploy/grafana/provisioning"),
                        ("/var/lib/grafana/dashboards", "deploy/grafana/dashboards")):
        if os.path.realpath(gvols.get(target, "")) != os.path.realpath(os.path.join(repo, src)):
            fail(combo, f"grafana: {src} is not mounted at {target}")
    if not any(published(p)[1] == "3000" for p in services["grafana"].get("ports") or []):
        fail(combo, "grafana: host port 3000 not published")
    for name, svc in services.items():
        for p in svc.get("ports") or []:
            if published(p)[0] != "127.0.0.1":
                fail(combo, f"{name}: publishes {p} on {published(p)[0] or 'every address'}, "
                            f"not 127.0.0.1")
    genv = services["grafana"].get("environment") or {}
    if truthy(genv.get("GF_AUTH_ANONYMOUS_ENABLED", "false")):
        fail(combo, "grafana: anonymous access is on (GF_AUTH_ANONYMOUS_ENABLED)")
    if "GF_SECURITY_ADMIN_PASSWORD" in genv:
        fail(combo, "grafana: GF_SECURITY_ADMIN_PASSWORD in the environment; use the __FILE form")
    if genv.get("GF_SECURITY_ADMIN_PASSWORD__FILE") != GRAFANA_PASSWORD:
        fail(combo, f"grafana: GF_SECURITY_ADMIN_PASSWORD__FILE is not {GRAFANA_PASSWORD}")
    gsrc = [v for v in volumes(services["grafana"]) if v[1] == GRAFANA_PASSWORD]
    want = os.path.join(compose_dir, "secrets", "grafana_admin_password")
    if not gsrc or os.path.realpath(gsrc[0][0] or "") != os.path.realpath(want) or not gsrc[0][2]:
        fail(combo, f"grafana: {GRAFANA_PASSWORD} is not deploy/compose/secrets/"
                    f"grafana_admin_password mounted read-only")

    gpu = any("gpu" in f for f in combo)
    learners = [n for n in services if n == "learner" or n.startswith("learner-")]
    if gpu:
        for name in learners + ["teacher"]:
            devs = (((services[name].get("deploy") or {}).get("resources") or {})
                    .get("reservations") or {}).get("devices") or []
            if len(devs) != 1 or devs[0].get("driver") != "nvidia" or "gpu" not in devs[0].get("capabilities", []):
                fail(combo, f"{name}: want exactly one nvidia gpu device reservation, got {devs}")
    sizes = {str((services[n].get("environment") or {}).get("KAPPA_WORLD_SIZE", "1")) for n in learners}
    if sizes != {str(len(learners))}:
        fail(combo, f"learner ranks {learners} but KAPPA_WORLD_SIZE {sorted(sizes)}")
    if len(learners) > 1:
        ranks = sorted(str((services[n].get("environment") or {}).get("KAPPA_RANK")) for n in learners)
        if ranks != [str(r) for r in range(len(learners))]:
            fail(combo, f"learner ranks have KAPPA_RANK {ranks}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--docker-compose", default="docker-compose")
    args = ap.parse_args()
    compose_dir = os.path.join(args.repo, "deploy", "compose")
    for combo in COMBOS:
        check(combo, render(args.docker_compose, compose_dir, combo), args.repo)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: {len(COMBOS)} compose file combinations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
