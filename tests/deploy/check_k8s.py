#!/usr/bin/env python3
"""Structure of the rendered Kubernetes manifests (`kubectl kustomize`) of
deploy/k8s/base and every overlay, rendered from a temporary copy of
deploy/k8s with secrets made by scripts/deploy_secrets.sh (k8s_render.py):

  * every container has liveness and readiness probes, and every container
    and init container has resource requests and limits, an image with an
    explicit tag (not latest) and the kappa-config ConfigMap mounted at
    /etc/kappa; pods run as non-root;
  * secure by default: every kappa container (learner, teacher, verifier,
    rollout) has the security settings in its environment (TLS, mutual TLS,
    certificate files, its worker token, the tokens directory under
    /etc/kappa/secrets), and /etc/kappa is one read-only projected volume of
    the ConfigMap and the generated Secret kappa-secrets (exactly ca.crt,
    tls.crt, tls.key, worker.token, observer.token, under secrets/; not
    world-readable, the pod's fsGroup set); init containers get the
    ConfigMap alone; no probe is a grpc: probe (they speak neither TLS nor
    tokens): learner/teacher/verifier run `kappa-<service> --config
    /etc/kappa/kappa.yaml --health-check 127.0.0.1:PORT` with a timeout;
  * NetworkPolicies: a default deny of ingress and egress for every pod,
    and the allowed flows are exactly: rollout -> learner/teacher/verifier
    gRPC ports, learner <-> learner on the dist port and 1024-65535 (c10d
    store, Gloo/NCCL), Prometheus (namespace monitoring, pods
    app.kubernetes.io/name=prometheus) -> each /metrics port, and DNS (53
    UDP/TCP) out of rollout and learner;
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
    learner replicas equal KAPPA_WORLD_SIZE.

usage: check_k8s.py REPO_ROOT [--kubectl PATH]
"""
import argparse
import os
import re
import sys

import yaml

from secure_env import SECRETS, SECURITY_ENV

from k8s_render import render_all, require_kubectl

TARGETS = ["base", "overlays/cpu-demo", "overlays/gpu"]
SECRET_KEYS = {"ca.crt", "tls.crt", "tls.key", "worker.token", "observer.token"}
KAPPA_CONTAINERS = {"learner", "teacher", "verifier", "rollout"}
JOBS = {"kappa-learner", "kappa-teacher", "kappa-verifier", "kappa-rollout"}
GRPC_PORT = {"learner": 50051, "teacher": 50052, "verifier": 50053}
PROMETHEUS_NS = {"kubernetes.io/metadata.name": "monitoring"}
PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus"}
COLLECTIVES = (1024, 65535)  # Gloo/NCCL pair sockets: ephemeral ports
errors = []


def fail(target, msg):
    errors.append(f"[{target}] {msg}")


def component(selector):
    """The kappa component a podSelector selects, "*" for every pod, else None."""
    if selector == {} or selector == {"matchLabels": {}}:
        return "*"
    labels = (selector or {}).get("matchLabels") or {}
    if set(selector or {}) == {"matchLabels"} and set(labels) == {
            "app.kubernetes.io/name", "app.kubernetes.io/component"} and \
            labels["app.kubernetes.io/name"] == "kappa":
        return labels["app.kubernetes.io/component"]
    return None


def peer_name(peer):
    if "ipBlock" in peer:
        return f"ipBlock {peer['ipBlock']}"
    ns, pod = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns is not None:
        if ns == {"matchLabels": PROMETHEUS_NS} and pod == {"matchLabels": PROMETHEUS_POD}:
            return "prometheus"
        return f"namespaceSelector {ns} podSelector {pod}"
    return component(pod) or f"podSelector {pod}"


def network_flows(target, policies):
    """(direction, pod, peer, protocol, port, end port) of every allowed flow,
    and the directions denied by default for every pod."""
    flows, default_deny = set(), set()
    for np in policies:
        name = np["metadata"]["name"]
        spec = np["spec"]
        pod = component(spec.get("podSelector"))
        if pod is None:
            fail(target, f"NetworkPolicy/{name}: podSelector {spec.get('podSelector')} is not "
                         f"{{}} or one kappa component")
            continue
        types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))
        for direction in types:
            rules = spec.get(direction.lower()) or []
            if not rules and pod == "*":
                default_deny.add(direction)
            for rule in rules:
                peers = rule.get("from" if direction == "Ingress" else "to") or [None]
                ports = rule.get("ports") or [None]
                for peer in peers:
                    who = "anywhere" if peer is None else peer_name(peer)
                    for port in ports:
                        if port is None:
                            flows.add((direction, pod, who, "any", "any", "any"))
                        else:
                            flows.add((direction, pod, who, port.get("protocol", "TCP"),
                                       port.get("port", "any"),
                                       port.get("endPort", port.get("port", "any"))))
    return flows, default_deny


def expected_flows(target, templates):
    ports = {}  # component -> {port name: number}
    for _, t in templates:
        comp = (t["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        for c in t["spec"]["containers"]:
            for p in c.get("ports") or []:
                ports.setdefault(comp, {})[p.get("name")] = p["containerPort"]
    want = set()
    for comp in ("learner", "teacher", "verifier"):
        grpc = ports.get(comp, {}).get("grpc")
        want.add(("Ingress", comp, "rollout", "TCP", grpc, grpc))
        want.add(("Egress", "rollout", comp, "TCP", grpc, grpc))
    for comp in KAPPA_CONTAINERS:
        metrics = ports.get(comp, {}).get("metrics")
        want.add(("Ingress", comp, "prometheus", "TCP", metrics, metrics))
    dist = ports.get("learner", {}).get("dist")
    for direction in ("Ingress", "Egress"):
        want.add((direction, "learner", "learner", "TCP", dist, dist))
        want.add((direction, "learner", "learner", "TCP") + COLLECTIVES)
    for comp in ("rollout", "learner"):
        for proto in ("UDP", "TCP"):
            want.add(("Egress", comp, "anywhere", proto, 53, 53))
    if None in {p for f in want for p in f[4:]}:
        fail(target, f"pod templates lack a named port (grpc/metrics/dist): {ports}")
    return want


def check_network_policies(target, by_kind, templates):
    flows, default_deny = network_flows(target, by_kind.get("NetworkPolicy", []))
    for direction in ("Ingress", "Egress"):
        if direction not in default_deny:
            fail(target, f"no default-deny NetworkPolicy for {direction} (podSelector {{}}, no rules)")
    want = expected_flows(target, templates)

    def show(f):
        return f"{f[0]} {f[1]} {'<-' if f[0] == 'Ingress' else '->'} {f[2]} {f[3]} " + \
            (f"{f[4]}" if f[4] == f[5] else f"{f[4]}-{f[5]}")
    for f in sorted(flows - want, key=str):
        fail(target, f"NetworkPolicy allows a flow not in the list: {show(f)}")
    for f in sorted(want - flows, key=str):
        fail(target, f"NetworkPolicy misses the flow: {show(f)}")


def check_secured_container(target, cname, c, spec, secrets):
    """TLS/mTLS/token environment and the projected config + secrets volume."""
    env = {e["name"]: e for e in c.get("env") or []}
    for name, value in SECURITY_ENV.items():
        if "valueFrom" in (env.get(name) or {}) or str((env.get(name) or {}).get("value")) != value:
            fail(target, f"{cname}: {name} is not {value}")
    mounts = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") in ("/etc/kappa", SECRETS)]
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    if len(mounts) != 1 or mounts[0]["mountPath"] != "/etc/kappa":
        fail(target, f"{cname}: want one volume at /etc/kappa holding kappa.yaml and secrets/, "
                     f"got {mounts}")
        return
    if not mounts[0].get("readOnly"):
        fail(target, f"{cname}: /etc/kappa is not mounted readOnly")
    projected = (vols.get(mounts[0]["name"]) or {}).get("projected") or {}
    sources = projected.get("sources") or []
    secret = [s["secret"] for s in sources if "secret" in s]
    if len(secret) != 1:
        fail(target, f"{cname}: /etc/kappa is not a projected volume with one Secret")
        return
    secret = secret[0]
    data = secrets.get(secret.get("name"))
    if data is None:
        fail(target, f"{cname}: Secret {secret.get('name')} is not in the manifests "
                     f"(the secretGenerator kappa-secrets)")
    items = {i["key"]: i["path"] for i in secret.get("items") or []}
    if items != {k: f"secrets/{k}" for k in SECRET_KEYS}:
        fail(target, f"{cname}: Secret items {items} are not each key at secrets/<key>")
    mode = projected.get("defaultMode", 0o644)
    modes = [mode] + [i["mode"] for i in secret.get("items") or [] if "mode" in i]
    if any(m & 0o007 for m in modes):
        fail(target, f"{cname}: secrets are readable by others (mode {oct(max(modes))})")
    if any(m & 0o070 for m in modes) and not (spec.get("securityContext") or {}).get("fsGroup"):
        fail(target, f"{cname}: files are group-readable but the pod sets no fsGroup")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(target, docs, repo):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    templates = [(w, w["spec"]["template"]) for w in workloads]
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    secrets = {d["metadata"]["name"]: d.get("data") or {} for d in by_kind.get("Secret", [])}

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
                    sources = [vol] + ((vol.get("projected") or {}).get("sources") or [])
                    cms = [(s.get("configMap") or {}).get("name") for s in sources if "configMap" in s]
                    if len(cms) != 1 or cms[0] not in configmaps or \
                            "kappa.yaml" not in configmaps[cms[0]].get("data", {}):
                        fail(target, f"{cname}: /etc/kappa is not a ConfigMap holding kappa.yaml")
                    if kind == "initContainers" and "configMap" not in vol:
                        fail(target, f"{cname}: an init container gets the ConfigMap alone at "
                                     f"/etc/kappa, not the secrets")
                args = [str(a) for a in c.get("args") or []]
                if "--config" in args and args[args.index("--config") + 1] != "/etc/kappa/kappa.yaml":
                    fail(target, f"{cname}: --config is not /etc/kappa/kappa.yaml")
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if (c.get(probe) or {}).get("grpc") is not None:
                        fail(target, f"{cname}: {probe} is a grpc: probe (no TLS, no token)")
                if kind != "containers":
                    continue
                if c["name"] in KAPPA_CONTAINERS:
                    check_secured_container(target, cname, c, spec, secrets)
                else:
                    fail(target, f"{cname}: not a kappa container ({sorted(KAPPA_CONTAINERS)})")
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    p = c.get(probe)
                    if not p:
                        if probe != "startupProbe":
                            fail(target, f"{cname}: no {probe}")
                        continue
                    want = GRPC_PORT.get(c["name"])
                    if want:
                        command = [str(a) for a in (p.get("exec") or {}).get("command") or []]
                        expect = [f"kappa-{c['name']}", "--config", "/etc/kappa/kappa.yaml",
                                  "--health-check", f"127.0.0.1:{want}"]
                        if command != expect:
                            fail(target, f"{cname}: {probe} is not exec {expect}: {p}")
                        if p.get("timeoutSeconds", 1) < 3:
                            fail(target, f"{cname}: {probe} timeoutSeconds "
                                         f"{p.get('timeoutSeconds', 1)} < 3 (an exec probe "
                                         f"starts a binary)")
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
    check_network_policies(target, by_kind, templates)
    generated = [n for n in secrets if n.startswith("kappa-secrets-")]
    if len(generated) != 1:
        fail(target, f"want one generated Secret kappa-secrets-<hash>, got {sorted(secrets)}")
    for name in generated:
        if set(secrets[name]) != SECRET_KEYS:
            fail(target, f"Secret {name}: keys {sorted(secrets[name])}, want {sorted(SECRET_KEYS)} "
                         f"(never the CA key, never Compose's grafana_admin_password)")

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
    require_kubectl(args.kubectl)
    rendered = render_all(args.repo, TARGETS, args.kubectl)
    for target in TARGETS:
        check(target, [d for d in yaml.safe_load_all(rendered[target]) if d], args.repo)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"ok: {', '.join(TARGETS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
