#!/usr/bin/env python3
"""Compose-equivalent local run: docker-compose.yml's kappa services as plain
processes on loopback, with the command lines, environment and mounted config
of the RENDERED Compose file (`docker-compose -f ... config`), so it proves
the deployment's wiring without a Docker engine.

    python3 deploy/compose/local_run.py --build-dir build            # 3 workers, 4 steps, tiny shapes
    python3 deploy/compose/local_run.py --build-dir build --scale rollout=5 --steps 10 --keep

What is taken from the rendered Compose config, as is: every kappa service
(those built from deploy/docker/Dockerfile), its `command`, `environment`,
`volumes`, `healthcheck` and `depends_on` (conditions service_started,
service_healthy, service_completed_successfully, in dependency order);
replicas from --scale (as `docker-compose up --scale`).

Substitutions (the only differences from a container run):
  * the image's ENTRYPOINT (/usr/local/bin/kappa-entrypoint) is
    deploy/docker/entrypoint.sh itself, with KAPPA_BIN_DIR pointing at a
    directory of symlinks to the built binaries (also first on PATH, so
    healthcheck commands such as `kappa-learner --health-check ...` resolve);
  * volume targets become host directories: a bind mount's target maps to its
    source (e.g. /etc/kappa/kappa.yaml -> deploy/compose/kappa.yaml), a named
    volume's target to <work>/volumes/<name>; rewritten in arguments and
    environment values wherever a value (or the value of a key=value
    argument) is or starts with a target path;
  * the secrets: a bind mount from deploy/compose/secrets (what
    scripts/deploy_secrets.sh fills before `docker-compose up`) maps to
    <work>/secrets, which this run fills with that script (--private), or to
    --secrets-dir; so the services run with the Compose file's TLS, mutual
    TLS and tokens for real;
  * a listen flag (--address or --metrics-address 0.0.0.0:P) becomes
    127.0.0.1:0 plus --ready-file: the process binds a port itself and
    reports it, and the next service starts only once it has; then
    `127.0.0.1:P` (in the service's own healthcheck) and `SERVICE:P` /
    `dns:///SERVICE:P` (peers, which must come later in depends_on order)
    are rewritten to 127.0.0.1:<that port>;
  * --tiny (default on): KAPPA_CFG_* environment overrides for a few-thousand-
    parameter model on one-digit sums and a short run (trainer.steps=--steps),
    appended to every kappa service's environment, so bootstrap takes seconds.
    It is the same override mechanism a Compose user would use.
Prometheus and Grafana (third-party images) are not started; every kappa
/metrics endpoint is scraped directly instead.

Checks: bootstrap exits 0; every healthcheck passes; on every gRPC server,
the security is real (unless --no-security-checks): its healthcheck fails
in plain text and with a wrong token, and passes with the observer token
(security.tokens_dir grants that role health); the learner exits 0
within --timeout; metrics.jsonl holds steps 1..steps; every long-running
process served /metrics; every rollout worker connected to the learner
(kappa_worker_learner_connections_total >= 1); at least --min-active-workers workers (default 1) report
kappa_worker_groups_total > 0. Then SIGTERM to everything,
SIGKILL after 5 s. Exit status 0 on success, 1 on any failure (with the
failing process's log tail), 2 on usage errors.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
ENTRYPOINT = os.path.join(REPO, "deploy", "docker", "entrypoint.sh")
SECRETS_SCRIPT = os.path.join(REPO, "scripts", "deploy_secrets.sh")
SECRETS = "secrets"  # the bind mounts' source: secrets/ beside the Compose file
KAPPA_DOCKERFILES = ("deploy/docker/Dockerfile", "deploy/docker/Dockerfile.cuda")
BINARIES = {  # name -> path relative to a CMake build directory
    "kappa-learner": "learner/kappa-learner",
    "kappa-teacher": "teacher_server/kappa-teacher",
    "kappa-verifier": "verifier/kappa-verifier",
    "kappa-rollout-worker": "rollout_worker/kappa-rollout-worker",
    "kappa": "cli/kappa",
}

# The one deviation from the Compose file: tiny shapes and a short run
# (cf. tests/integration/tiny_run_config.h), through KAPPA_CFG_* overrides.
def tiny_overrides(steps):
    shape = {"HIDDEN_SIZE": 32, "INTERMEDIATE_SIZE": 64, "NUM_HIDDEN_LAYERS": 1,
             "NUM_ATTENTION_HEADS": 2, "NUM_KEY_VALUE_HEADS": 1, "MAX_POSITION_EMBEDDINGS": 12}
    env = {
        "KAPPA_CFG_TASK__MIN_DIGITS": 1, "KAPPA_CFG_TASK__MAX_DIGITS": 1,
        "KAPPA_CFG_TASK__TRAIN_SIZE": 60, "KAPPA_CFG_TASK__HELDOUT_SIZE": 20,
        "KAPPA_CFG_TEACHER__BOOTSTRAP__STEPS": 30, "KAPPA_CFG_TEACHER__BOOTSTRAP__BATCH_SIZE": 16,
        "KAPPA_CFG_STUDENT__BOOTSTRAP__STEPS": 5, "KAPPA_CFG_STUDENT__BOOTSTRAP__BATCH_SIZE": 16,
        "KAPPA_CFG_LEARNER__BUFFER_GROUPS": 8,
        "KAPPA_CFG_ROLLOUT__MAX_NEW_TOKENS": 4,
        "KAPPA_CFG_TRAINER__STEPS": steps, "KAPPA_CFG_TRAINER__GROUPS_PER_STEP": 3,
        "KAPPA_CFG_TRAINER__GROUP_SIZE": 4, "KAPPA_CFG_TRAINER__EVAL_EVERY": 2,
        "KAPPA_CFG_TRAINER__EVAL_EXAMPLES": 20, "KAPPA_CFG_TRAINER__CHECKPOINT_EVERY": 2,
    }
    for role in ("TEACHER", "STUDENT"):
        for k, v in shape.items():
            env[f"KAPPA_CFG_{role}__SHAPE__{k}"] = v
    return {k: str(v) for k, v in env.items()}


class Failure(Exception):
    def __init__(self, message, proc=None):
        super().__init__(message)
        self.proc = proc


def log(msg):
    print(f"[local_run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def render_compose(docker_compose, files):
    cmd = [docker_compose]
    for f in files:
        cmd += ["-f", f]
    cmd.append("config")
    env = dict(os.environ)
    for var in ("KAPPA_IMAGE", "KAPPA_CUDA_IMAGE"):
        env.pop(var, None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return yaml.safe_load(out.stdout)


def is_kappa_service(svc):
    build = svc.get("build")
    if isinstance(build, dict) and build.get("dockerfile") in KAPPA_DOCKERFILES:
        return True
    return str(svc.get("image", "")).split(":")[0].endswith("kappa")


def as_list(command):
    if command is None:
        return []
    if isinstance(command, str):
        import shlex
        return shlex.split(command)
    return [str(c) for c in command]


def env_dict(environment):
    if environment is None:
        return {}
    if isinstance(environment, dict):
        return {k: "" if v is None else str(v) for k, v in environment.items()}
    out = {}
    for item in environment:
        k, _, v = str(item).partition("=")
        out[k] = v
    return out


def parse_volume(vol):
    """(source, target, kind) of a rendered short or long volume entry."""
    if isinstance(vol, dict):
        return vol.get("source"), vol["target"], vol.get("type", "volume")
    parts = str(vol).split(":")
    if len(parts) == 1:
        return None, parts[0], "volume"
    source, target = parts[0], parts[1]
    kind = "bind" if source.startswith(("/", ".", "~")) else "volume"
    return source, target, kind


def topo_order(services):
    order, seen = [], set()

    def visit(name, stack):
        if name in seen:
            return
        if name in stack:
            raise Failure(f"depends_on cycle through {name}")
        for dep in services[name].get("depends_on") or {}:
            if dep in services:
                visit(dep, stack | {name})
        seen.add(name)
        order.append(name)

    for name in sorted(services):
        visit(name, set())
    return order


class Proc:
    def __init__(self, service, replica, argv, env, log_path):
        self.service, self.replica, self.argv, self.log_path = service, replica, argv, log_path
        self.log_file = open(log_path, "w")
        self.popen = subprocess.Popen(argv, env=env, stdout=self.log_file,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self.name = f"{service}-{replica + 1}"

    def poll(self):
        return self.popen.poll()

    def tail(self, lines=40):
        self.log_file.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


class LocalRun:
    def __init__(self, args, config, work, compose_dirs):
        self.args, self.work = args, work
        # secrets/ beside each Compose file (deploy/compose/secrets) -> self.secrets
        self.compose_secrets = sorted({os.path.realpath(os.path.join(d, SECRETS))
                                       for d in compose_dirs})
        all_services = config.get("services") or {}
        self.services = {n: s for n, s in all_services.items() if is_kappa_service(s)}
        self.skipped = sorted(set(all_services) - set(self.services))
        self.named_volumes = set((config.get("volumes") or {}).keys())
        self.scale = {n: 1 for n in self.services}
        for item in args.scale:
            name, _, count = item.partition("=")
            if name not in self.services or not count.isdigit():
                raise Failure(f"--scale {item}: not a kappa service or not a count")
            self.scale[name] = int(count)
        self.ports = {}  # (service, replica, container port) -> loopback port
        self.procs = []
        self.bin_dir = os.path.join(work, "bin")
        self.secrets = os.path.abspath(args.secrets_dir or os.path.join(work, "secrets"))
        self.secured = []  # gRPC servers whose security was probed
        self.tiny = tiny_overrides(args.steps) if args.tiny else {}
        self.metrics_seen = {}  # proc name -> last scraped text

    # ---- substitutions
    def mounts(self, svc):
        out = []
        for vol in svc.get("volumes") or []:
            source, target, kind = parse_volume(vol)
            if kind == "bind":
                host = os.path.abspath(source)
                real = os.path.realpath(host)
                for top in self.compose_secrets:
                    if real == top or real.startswith(top + os.sep):
                        host = self.secrets + real[len(top):]
            else:
                if source not in self.named_volumes and source is not None:
                    raise Failure(f"volume {source} is not declared")
                host = os.path.join(self.work, "volumes", source or target.strip("/").replace("/", "_"))
                os.makedirs(host, exist_ok=True)
            out.append((target.rstrip("/"), host))
        # Longest target first, so /data/x maps through /data/x before /data.
        return sorted(out, key=lambda m: -len(m[0]))

    def port(self, service, replica, container_port):
        key = (service, replica, container_port)
        if key not in self.ports:
            started = any(p.service == service for p in self.procs)
            raise Failure(f"{service}: nothing listens on container port {container_port} "
                          + (f"(no 0.0.0.0:{container_port} flag)" if started else
                             "yet (it starts later: add it to depends_on)"))
        return self.ports[key]

    def rewrite(self, value, service, replica, mounts):
        m = re.fullmatch(r"([a-z_][a-z0-9_.]*)=(.*)", value)
        if m:  # a config override key=value: rewrite the value
            return f"{m.group(1)}={self.rewrite(m.group(2), service, replica, mounts)}"
        for target, host in mounts:
            if value == target:
                return host
            if value.startswith(target + "/"):
                return host + value[len(target):]

        def own(m):
            return f"127.0.0.1:{self.port(service, replica, int(m.group(2)))}"

        value = re.sub(r"^(0\.0\.0\.0|127\.0\.0\.1|localhost):(\d+)$", own, value)

        def peer(m):
            name = m.group(2)
            if name not in self.services:
                return m.group(0)
            return f"{m.group(1) or ''}127.0.0.1:{self.port(name, 0, int(m.group(3)))}"

        return re.sub(r"^(dns:///)?([A-Za-z0-9_.-]+):(\d+)$", peer, value)

    def environment(self, svc, service, replica, mounts):
        env = {"PATH": self.bin_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
               "HOME": os.environ.get("HOME", self.work), "LANG": "C.UTF-8",
               "KAPPA_BIN_DIR": self.bin_dir}
        for k, v in env_dict(svc.get("environment")).items():
            env[k] = self.rewrite(v, service, replica, mounts)
        env.update(self.tiny)
        return env

    # ---- processes
    def start(self, service):
        """Starts every replica of `service` and waits until each has bound its
        listeners: a container port P (flag 0.0.0.0:P) becomes port 0 on
        loopback, and the process says which port it bound in its
        --ready-file (services/ready_file.h). No port is picked here for a
        process to bind later, so a parallel test cannot take it in between."""
        svc = self.services[service]
        mounts = self.mounts(svc)
        command = as_list(svc.get("command"))
        # argv index -> (container port, the ready file's key for it)
        listen = {}
        for i, a in enumerate(command):
            m = re.fullmatch(r"0\.0\.0\.0:(\d+)", a)
            if m:
                flag = command[i - 1] if i > 0 else ""
                key = {"--address": "address", "--metrics-address": "metrics_address"}.get(flag)
                if key is None:
                    raise Failure(f"{service}: {a} follows {flag or 'nothing'}, not "
                                  f"--address or --metrics-address")
                listen[i] = (int(m.group(1)), key)
        for replica in range(self.scale[service]):
            argv = [ENTRYPOINT] + ["127.0.0.1:0" if i in listen else
                                   self.rewrite(a, service, replica, mounts)
                                   for i, a in enumerate(command)]
            ready_file = os.path.join(self.work, "ready", f"{service}-{replica + 1}.json")
            if listen:
                argv += ["--ready-file", ready_file]
            env = self.environment(svc, service, replica, mounts)
            path = os.path.join(self.work, "logs", f"{service}-{replica + 1}.log")
            proc = Proc(service, replica, argv, env, path)
            self.procs.append(proc)
            log(f"started {proc.name} (pid {proc.popen.pid}): {' '.join(argv[1:])}")
            if listen:
                ready = self.wait_ready(proc, ready_file)
                for container_port, key in listen.values():
                    bound = ready.get(key, "")
                    if not re.fullmatch(r"127\.0\.0\.1:\d+", bound):
                        raise Failure(f"{ready_file}: {key} is {bound!r}, not 127.0.0.1:PORT", proc)
                    self.ports[(service, replica, container_port)] = int(bound.rsplit(":", 1)[1])

    def wait_ready(self, proc, ready_file):
        """The JSON object `proc` writes to `ready_file` once it listens."""
        deadline = time.time() + self.args.timeout
        while not os.path.exists(ready_file):
            if proc.poll() is not None:
                raise Failure(f"{proc.name} exited with status {proc.poll()} before it "
                              f"listened", proc)
            if time.time() > deadline:
                raise Failure(f"{proc.name} wrote no {ready_file} in time", proc)
            time.sleep(0.05)
        with open(ready_file) as f:
            return json.load(f)

    def replicas(self, service):
        return [p for p in self.procs if p.service == service]

    def check_alive(self):
        for p in self.procs:
            rc = p.poll()
            if rc is not None and rc != 0:
                raise Failure(f"{p.name} exited with status {rc}", p)

    def wait_completed(self, service, deadline):
        for p in self.replicas(service):
            while p.poll() is None:
                if time.time() > deadline:
                    raise Failure(f"{p.name} did not complete in time", p)
                time.sleep(0.2)
            if p.poll() != 0:
                raise Failure(f"{p.name} exited with status {p.poll()}", p)
        log(f"{service} completed successfully")

    def wait_healthy(self, service, deadline):
        svc = self.services[service]
        hc = svc.get("healthcheck") or {}
        test = as_list(hc.get("test"))
        if not test or test[0] == "NONE" or hc.get("disable"):
            raise Failure(f"{service}: depends_on condition service_healthy but no healthcheck")
        if test[0] == "CMD-SHELL":
            raise Failure(f"{service}: CMD-SHELL healthchecks are not supported here; use CMD")
        if test[0] == "CMD":
            test = test[1:]
        mounts = self.mounts(svc)
        for p in self.replicas(service):
            argv = [self.rewrite(a, service, p.replica, mounts) for a in test]
            env = self.environment(svc, service, p.replica, mounts)
            exe = shutil.which(argv[0], path=env["PATH"])
            if exe is None:
                raise Failure(f"{service}: healthcheck command {argv[0]} not found")
            while True:
                self.check_alive()
                if p.poll() is not None:
                    raise Failure(f"{p.name} exited before becoming healthy", p)
                r = subprocess.run([exe] + argv[1:], env=env, capture_output=True, text=True,
                                   timeout=30)
                if r.returncode == 0:
                    break
                if time.time() > deadline:
                    raise Failure(f"{p.name} not healthy in time: {r.stdout}{r.stderr}", p)
                time.sleep(0.3)
            log(f"{p.name} healthy ({' '.join(argv)})")
            if self.args.security_checks:
                self.check_security(p, [exe] + argv[1:], env)

    def check_security(self, p, probe, env):
        """The healthcheck `probe` passed with the service's own settings; it
        must fail in plain text and with a wrong token, and pass with the
        observer token: TLS, client authentication and roles are on."""
        if env.get("KAPPA_CFG_SECURITY__TLS") != "true" or \
                env.get("KAPPA_CFG_SECURITY__MUTUAL_TLS") != "true" or \
                not env.get("KAPPA_CFG_SECURITY__TOKENS_DIR"):
            raise Failure(f"{p.name}: the Compose environment does not turn on TLS, mutual TLS "
                          f"and security.tokens_dir (--no-security-checks to skip)", p)
        plain = {k: v for k, v in env.items() if not k.startswith("KAPPA_CFG_SECURITY__")}
        wrong = os.path.join(self.work, "wrong.token")
        with open(wrong, "w") as f:
            f.write("0" * 64)
        observer = os.path.join(env["KAPPA_CFG_SECURITY__TOKENS_DIR"], "observer.token")
        for label, penv, want_ok in (
                ("plain text", plain, False),
                ("a wrong token", dict(env, KAPPA_CFG_SECURITY__TOKEN_FILE=wrong), False),
                ("the observer token", dict(env, KAPPA_CFG_SECURITY__TOKEN_FILE=observer), True)):
            r = subprocess.run(probe, env=penv, capture_output=True, text=True, timeout=30)
            if (r.returncode == 0) != want_ok:
                raise Failure(f"{p.name}: health check with {label} "
                              f"{'failed' if want_ok else 'passed'} (exit {r.returncode}): "
                              f"{r.stdout}{r.stderr}", p)
        self.secured.append(p.name)
        log(f"{p.name}: health refused in plain text and with a wrong token, "
            f"served to the observer token")

    def scrape_all(self):
        for p in self.procs:
            if p.poll() is not None:
                continue
            svc = self.services[p.service]
            argv = as_list(svc.get("command"))
            for i, a in enumerate(argv[:-1]):
                if a == "--metrics-address":
                    m = re.fullmatch(r"0\.0\.0\.0:(\d+)", argv[i + 1])
                    if not m:
                        continue
                    port = self.port(p.service, p.replica, int(m.group(1)))
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                            self.metrics_seen[p.name] = r.read().decode("utf-8", "replace")
                    except OSError:
                        pass

    def stop_all(self):
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.time() + 5
        for p in live:
            try:
                p.popen.wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                log(f"{p.name} ignored SIGTERM; SIGKILL")
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
        for p in self.procs:
            p.log_file.close()

    # ---- the run
    def run(self):
        args = self.args
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        os.makedirs(self.bin_dir, exist_ok=True)
        for name, path in self.binaries().items():
            os.symlink(path, os.path.join(self.bin_dir, name))
        log(f"kappa services: {', '.join(sorted(self.services))}; not started "
            f"(third-party images): {', '.join(self.skipped) or '-'}; work dir {self.work}")
        os.makedirs(os.path.join(self.work, "ready"), exist_ok=True)
        if not args.secrets_dir:
            r = subprocess.run(["bash", SECRETS_SCRIPT, "--private", self.secrets],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise Failure(f"{SECRETS_SCRIPT} {self.secrets} failed: {r.stderr}")
            log(f"secrets for /etc/kappa/secrets made in {self.secrets}")
        order = topo_order(self.services)
        deadline = time.time() + args.timeout
        for service in order:
            for dep, cond in (self.services[service].get("depends_on") or {}).items():
                condition = (cond or {}).get("condition", "service_started")
                if dep not in self.services:
                    raise Failure(f"{service} depends on {dep}, which is not a kappa service")
                if condition == "service_completed_successfully":
                    self.wait_completed(dep, deadline)
                elif condition == "service_healthy":
                    self.wait_healthy(dep, deadline)
                elif condition != "service_started":
                    raise Failure(f"{service}: unknown depends_on condition {condition}")
            self.start(service)

        learners = self.replicas("learner")
        if not learners:
            raise Failure("no learner service")
        learner = learners[0]
        while learner.poll() is None:
            self.check_alive()
            self.scrape_all()
            if time.time() > deadline:
                raise Failure(f"learner did not finish within {args.timeout} s", learner)
            time.sleep(0.5)
        if learner.poll() != 0:
            raise Failure(f"learner exited with status {learner.poll()}", learner)
        log(f"learner exited 0")
        self.scrape_all()
        self.check_results(learner)
        if args.security_checks:
            if not self.secured:
                raise Failure("no gRPC server's security was probed (no healthcheck waited for)")
            log(f"TLS, mutual TLS and tokens verified on {', '.join(self.secured)}")

    def binaries(self):
        found = {}
        for item in self.args.binary:
            name, _, path = item.partition("=")
            found[name] = os.path.abspath(path)
        for name, rel in BINARIES.items():
            if name not in found and self.args.build_dir:
                found[name] = os.path.abspath(os.path.join(self.args.build_dir, rel))
        missing = [n for n in BINARIES if n not in found or not os.access(found[n], os.X_OK)]
        if missing:
            raise Failure(f"binaries missing: {', '.join(missing)} (build them: "
                          f"cmake --build BUILD --target kappa_suite)")
        return found

    def check_results(self, learner):
        argv = learner.argv
        run_dir = argv[argv.index("--run-dir") + 1] if "--run-dir" in argv else None
        if run_dir is None:
            raise Failure("learner has no --run-dir")
        path = os.path.join(run_dir, "metrics.jsonl")
        steps = set()
        try:
            with open(path) as f:
                for line in f:
                    steps.add(json.loads(line).get("step"))
        except (OSError, ValueError) as e:
            raise Failure(f"{path}: {e}", learner)
        want = set(range(1, self.args.steps + 1))
        if not want <= steps:
            raise Failure(f"{path}: steps {sorted(want - steps)} missing", learner)
        log(f"{path}: steps 1..{self.args.steps} present")
        if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
            raise Failure(f"{run_dir}/checkpoints missing", learner)

        for p in self.procs:
            svc = self.services[p.service]
            if "--metrics-address" in as_list(svc.get("command")) and p.name not in self.metrics_seen:
                raise Failure(f"{p.name}: /metrics never answered", p)
        # Wiring: every worker reached the learner through its service address
        # (kappa_worker_learner_connections_total > 0 in its last scrape).
        # Which of them got work before a short run ended is a race (a worker
        # that loads its policy last may find the steps done), so only one
        # worker is required to have sent groups by default.
        for p in self.replicas("rollout"):
            text = self.metrics_seen.get(p.name, "")
            m = re.search(r"^kappa_worker_learner_connections_total (\S+)$", text, re.M)
            if not m or float(m.group(1)) < 1:
                raise Failure(f"{p.name} never connected to the learner", p)
        log(f"all {len(self.replicas('rollout'))} rollout workers connected to the learner")
        active = {}
        for p in self.replicas("rollout"):
            text = self.metrics_seen.get(p.name, "")
            m = re.search(r"^kappa_worker_groups_total(?:\{[^}]*\})? (\S+)$", text, re.M)
            active[p.name] = float(m.group(1)) if m else 0.0
        log("kappa_worker_groups_total: " + ", ".join(f"{k}={v:g}" for k, v in sorted(active.items())))
        n_active = sum(1 for v in active.values() if v > 0)
        if n_active < min(self.args.min_active_workers, len(active)) or not active:
            raise Failure(f"only {n_active} of {len(active)} workers sent groups "
                          f"(want >= {self.args.min_active_workers})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", help="CMake build directory with the five binaries")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="path of one binary (kappa-learner=..., overrides --build-dir)")
    ap.add_argument("-f", "--file", action="append", dest="files", metavar="COMPOSE_FILE",
                    help="compose file(s), as docker-compose -f (default: docker-compose.yml here)")
    ap.add_argument("--docker-compose", default=shutil.which("docker-compose") or "docker-compose")
    ap.add_argument("--scale", action="append", default=[], metavar="SERVICE=N",
                    help="replicas, as docker-compose up --scale (default rollout=3)")
    ap.add_argument("--steps", type=int, default=40, help="trainer.steps (KAPPA_CFG_TRAINER__STEPS)")
    ap.add_argument("--no-tiny", dest="tiny", action="store_false",
                    help="keep the Compose config's model shapes and steps")
    ap.add_argument("--timeout", type=float, default=180, help="seconds for the whole run")
    ap.add_argument("--min-active-workers", type=int, default=1)
    ap.add_argument("--secrets-dir", help="use these secrets (scripts/deploy_secrets.sh output) "
                    "for deploy/compose/secrets instead of making new ones in the work dir")
    ap.add_argument("--no-security-checks", dest="security_checks", action="store_false",
                    help="do not probe the servers in plain text and with wrong/observer tokens")
    ap.add_argument("--work-dir", help="keep volumes and logs here (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temp work dir")
    args = ap.parse_args()
    if not args.scale:
        args.scale = ["rollout=3"]
    files = args.files or [os.path.join(HERE, "docker-compose.yml")]
    if not args.tiny and args.steps != 4:
        print("--steps only applies with the tiny overrides", file=sys.stderr)
        return 2

    work = args.work_dir or tempfile.mkdtemp(prefix="kappa-local-run-")
    if args.work_dir:
        if os.path.exists(work) and os.listdir(work):
            print(f"--work-dir {work} is not empty", file=sys.stderr)
            return 2
        os.makedirs(work, exist_ok=True)
    started = time.time()
    run = None
    try:
        config = render_compose(args.docker_compose, files)
        run = LocalRun(args, config, work, [os.path.dirname(os.path.abspath(f)) for f in files])
        run.run()
        log(f"PASS in {time.time() - started:.1f} s")
        return 0
    except Failure as e:
        log(f"FAIL: {e}")
        if e.proc is not None:
            print(f"---- last lines of {e.proc.name} ({e.proc.log_path}) ----\n{e.proc.tail()}",
                  file=sys.stderr)
        return 1
    finally:
        if run is not None:
            run.stop_all()
        if not args.work_dir and not args.keep and run is not None:
            shutil.rmtree(work, ignore_errors=True)
        elif run is not None:
            log(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
