#!/usr/bin/env python3
"""Structure of the rendered Kubernetes manifests (`kubectl kustomize`) of
deploy/k8s/base and every overlay:

  * every container has liveness and readiness probes (gRPC probes on the
    gRPC port for learner/teacher/verifier), and every container and init
    container has resource requests and limits, an image with an explicit
    tag (not latest) and the kappa-config ConfigMap mounted at /etc/kappa;
    pods run as non-root;
  * every Service selects the labels of some pod template and its
    targetPorts name ports of that template; the StatefulSet's serviceName
    is a headless Service;
  * every PodMonitor selects some pod template that has its port, and sets
    a job label the pod carries; all four jobs are covered;
  * the HPA targets an existing Deployment; the learner is a StatefulSet
    with volumeClaimTemplates; the ConfigMap's kappa.yaml is
    deploy/compose/kappa.yaml byte for byte;
  * the PrometheusRule holds exactly the groups of deploy/prometheus/rules.yml;
  * gpu overlay: learner and teacher containers limit nvidia.com/gpu, and
    learner replicas equal KAPPA_WORLD_SIZE;
  * *-tls overlays (components/tls): every kappa container has the
    security settings in its environment, the token from Secret kappa-token
    and Secret kappa-tls at /etc/kappa/tls; gRPC services are probed by
    `kappa-<service> --health-check` naming the certificate's server name.

usage: check_k8s.py REPO_ROOT [--kubectl PATH]
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

TARGETS = ["base", "overlays/cpu-demo", "overlays/gpu", "overlays/cpu-demo-tls"]
SECURITY_ENV = {"KAPPA_CFG_SECURITY__TLS": "true", "KAPPA_CFG_SECURITY__MUTUAL_TLS": "true",
                "KAPPA_CFG_SECURITY__CERT_FILE": "/etc/kappa/tls/tls.crt",
                "KAPPA_CFG_SECURITY__KEY_FILE": "/etc/kappa/tls/tls.key",
                "KAPPA_CFG_SECURITY__CA_FILE": "/etc/kappa/tls/ca.crt"}
JOBS = {"kappa-learner", "kappa-teacher", "kappa-verifier", "kappa-rollout"}
GRPC_PORT = {"learner": 50051, "teacher": 50052, "verifier": 50053}
errors = []


def fail(target, msg):
    errors.append(f"[{target}] {msg}")


def render(kubectl, path):
    r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"kubectl kustomize {path}: {r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(target, docs, repo):
    tls = target.endswith("-tls")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    templates = [(w, w["spec"]["template"]) for w in workloads]
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}

    for w, t in templates:
        wname = f"{w['kind']}/{w['metadata']['name']}"
        spec = t["spec"]
        sc = spec.get("securityContext") or {}
        if not sc.get("runAsNonRoot") or sc.get("runAsUser") in (None, 0):
            fail(target, f"{wname}: pod does not run as a non-root user")
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                cname = f"{wname}/{c['name']}"
                image = c.get("image", "")
                last = image.rsplit("/", 1)[-1]
                if ":" not in last or last.endswith(":latest"):
                    fail(target, f"{cname}: image '{image}' has no explicit tag")
                res = c.get("resources") or {}
                for part in ("requests", "limits"):
                    if not (res.get(part) or {}).get("cpu") or not (res.get(part) or {}).get("memory"):
                        fail(target, f"{cname}: no cpu/memory {part}")
                mounts = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == "/etc/kappa"]
                if not mounts:
                    fail(target, f"{cname}: config not mounted at /etc/kappa")
                else:
                    vol = vols.get(mounts[0]["name"], {})
                    cm = (vol.get("configMap") or {}).get("name")
                    if cm not in configmaps or "kappa.yaml" not in configmaps[cm].get("data", {}):
                        fail(target, f"{cname}: /etc/kappa is not a ConfigMap holding kappa.yaml")
                args = [str(a) for a in c.get("args") or []]
                if "--config" in args and args[args.index("--config") + 1] != "/etc/kappa/kappa.yaml":
                    fail(target, f"{cname}: --config is not /etc/kappa/kappa.yaml")
                if kind != "containers":
                    continue
                if tls:
                    env = {e["name"]: e for e in c.get("env") or []}
                    for name, value in SECURITY_ENV.items():
                        if (env.get(name) or {}).get("value") != value:
                            fail(target, f"{cname}: {name} is not {value}")
                    ref = ((env.get("KAPPA_AUTH_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef")
                    if ref != {"name": "kappa-token", "key": "token"}:
                        fail(target, f"{cname}: KAPPA_AUTH_TOKEN is not from Secret kappa-token")
                    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
                    volumes = {v["name"]: v for v in t["spec"].get("volumes") or []}
                    secret = (volumes.get(mounts.get("/etc/kappa/tls")) or {}).get("secret") or {}
                    if secret.get("secretName") != "kappa-tls":
                        fail(target, f"{cname}: Secret kappa-tls is not mounted at /etc/kappa/tls")
                for probe in ("livenessProbe", "readinessProbe"):
                    p = c.get(probe)
                    if not p:
                        fail(target, f"{cname}: no {probe}")
                        continue
                    want = GRPC_PORT.get(c["name"])
                    if want and tls:
                        command = [str(a) for a in (p.get("exec") or {}).get("command") or []]
                        if p.get("grpc") or command[:1] != [f"kappa-{c['name']}"] or \
                                command[-2:] != ["--health-check", f"127.0.0.1:{want}"] or \
                                f"security.server_name={c['name']}" not in command:
                            fail(target, f"{cname}: {probe} is not `kappa-{c['name']} "
                                         f"--health-check 127.0.0.1:{want}` naming the server")
                    elif want and (p.get("grpc") or {}).get("port") != want:
                        fail(target, f"{cname}: {probe} is not a gRPC probe on {want}")
                    if want and f"0.0.0.0:{want}" not in args:
                        fail(target, f"{cname}: does not listen on 0.0.0.0:{want}")

    def template_ports(t):
        return {p.get("name"): p["containerPort"] for c in t["spec"]["containers"]
                for p in c.get("ports") or []}

    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    for s in services.values():
        sel = s["spec"].get("selector") or {}
        matched = [t for _, t in templates if selects(sel, t["metadata"].get("labels") or {})]
        if not matched:
            fail(target, f"Service/{s['metadata']['name']}: selector {sel} matches no pod template")
            continue
        for p in s["spec"].get("ports") or []:
            tp = p.get("targetPort", p["port"])
            if not any((tp in template_ports(t)) if isinstance(tp, str) else
                       (tp in template_ports(t).values()) for t in matched):
                fail(target, f"Service/{s['metadata']['name']}: targetPort {tp} is no port of the pods")
    for w in by_kind.get("StatefulSet", []):
        svc = services.get(w["spec"].get("serviceName"))
        if not svc or svc["spec"].get("clusterIP") != "None":
            fail(target, f"StatefulSet/{w['metadata']['name']}: serviceName is not a headless Service")
    for name in ("learner", "teacher", "verifier"):
        if services.get(name, {}).get("spec", {}).get("clusterIP") != "None":
            fail(target, f"Service/{name}: missing or not headless (gRPC round_robin needs every pod's A record)")
    learner = [w for w in by_kind.get("StatefulSet", []) if w["metadata"]["name"] == "learner"]
    if not learner:
        fail(target, "no learner StatefulSet")
    elif not learner[0]["spec"].get("volumeClaimTemplates"):
        fail(target, "learner StatefulSet has no volumeClaimTemplates")

    jobs = set()
    for pm in by_kind.get("PodMonitor", []):
        name = pm["metadata"]["name"]
        sel = (pm["spec"].get("selector") or {}).get("matchLabels") or {}
        matched = [t for _, t in templates if selects(sel, t["metadata"].get("labels") or {})]
        if not matched:
            fail(target, f"PodMonitor/{name}: selects no pod")
            continue
        for ep in pm["spec"].get("podMetricsEndpoints") or []:
            if not all(ep.get("port") in template_ports(t) for t in matched):
                fail(target, f"PodMonitor/{name}: port {ep.get('port')} is not on the selected pods")
        job_label = pm["spec"].get("jobLabel")
        for t in matched:
            job = (t["metadata"].get("labels") or {}).get(job_label)
            if not job:
                fail(target, f"PodMonitor/{name}: pods lack its jobLabel {job_label}")
            jobs.add(job)
    if jobs != JOBS:
        fail(target, f"PodMonitors cover jobs {sorted(j for j in jobs if j)}, want {sorted(JOBS)}")

    deployments = {d["metadata"]["name"] for d in by_kind.get("Deployment", [])}
    for h in by_kind.get("HorizontalPodAutoscaler", []):
        ref = h["spec"]["scaleTargetRef"]
        if ref["kind"] != "Deployment" or ref["name"] not in deployments:
            fail(target, f"HPA/{h['metadata']['name']}: target {ref} does not exist")
        if h["apiVersion"] != "autoscaling/v2":
            fail(target, f"HPA/{h['metadata']['name']}: apiVersion {h['apiVersion']}")
    if not by_kind.get("HorizontalPodAutoscaler"):
        fail(target, "no HorizontalPodAutoscaler")

    compose_cfg = open(os.path.join(repo, "deploy", "compose", "kappa.yaml")).read()
    for cm in configmaps.values():
        if "kappa.yaml" in cm.get("data", {}) and cm["data"]["kappa.yaml"] != compose_cfg:
            fail(target, f"ConfigMap/{cm['metadata']['name']}: kappa.yaml differs from deploy/compose/kappa.yaml")

    rules = yaml.safe_load(open(os.path.join(repo, "deploy", "prometheus", "rules.yml")))
    prs = by_kind.get("PrometheusRule", [])
    if len(prs) != 1:
        fail(target, f"{len(prs)} PrometheusRules, want 1")
    elif prs[0]["spec"]["groups"] != rules["groups"]:
        fail(target, "PrometheusRule groups differ from deploy/prometheus/rules.yml "
                     "(python3 deploy/tools/prometheus_rule.py)")

    if "gpu" in target:
        for w, t in templates:
            for c in t["spec"]["containers"]:
                if c["name"] in ("learner", "teacher"):
                    lim = (c.get("resources") or {}).get("limits") or {}
                    if not lim.get("nvidia.com/gpu"):
                        fail(target, f"{c['name']}: no nvidia.com/gpu limit")
        if learner:
            c = [c for c in learner[0]["spec"]["template"]["spec"]["containers"] if c["name"] == "learner"][0]
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            if str(learner[0]["spec"].get("replicas")) != str(env.get("KAPPA_WORLD_SIZE")):
                fail(target, f"learner replicas {learner[0]['spec'].get('replicas')} != "
                             f"KAPPA_WORLD_SIZE {env.get('KAPPA_WORLD_SIZE')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--kubectl", default="kubectl")
    args = ap.parse_args()
    for target in TARGETS:
        check(target, render(args.kubectl, os.path.join(args.repo, "deploy", "k8s", target)), args.repo)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: {', '.join(TARGETS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
