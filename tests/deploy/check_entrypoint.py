#!/usr/bin/env python3
"""deploy/docker/entrypoint.sh against fake binaries (KAPPA_BIN_DIR): each
first argument reaches the right binary with the rest of the command line;
KAPPA_WORLD_SIZE > 1 appends --world-size/--rank/--dist-store to the learner
(and only then, and not over an explicit --world-size); bootstrap runs
`kappa sft` for teacher and student into --data-dir, skips them when the key
(config + model-shaping KAPPA_CFG_ variables) is unchanged, redoes them when
it changes, honours --role, and fails when kappa sft fails.

usage: check_entrypoint.py ENTRYPOINT
"""
import os
import subprocess
import sys
import tempfile

FAKE = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_LOG"
if [[ $(basename "$0") == kappa && $1 == sft ]]; then
  [[ -n ${FAKE_SFT_FAIL:-} ]] && exit 3
  out=""; while (($#)); do [[ $1 == --out ]] && out=$2; shift; done
  mkdir -p "$out" && touch "$out/model.safetensors" "$out/config.json"
fi
"""
errors = []


def main():
    entry = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        for b in ("kappa-learner", "kappa-teacher", "kappa-verifier", "kappa-rollout-worker", "kappa"):
            p = os.path.join(bindir, b)
            with open(p, "w") as f:
                f.write(FAKE)
            os.chmod(p, 0o755)
        log = os.path.join(tmp, "log")
        config = os.path.join(tmp, "kappa.yaml")
        with open(config, "w") as f:
            f.write("name: x\n")
        data = os.path.join(tmp, "data")

        def run(args, extra_env=None, want_rc=0):
            open(log, "w").close()
            env = {"PATH": os.environ["PATH"], "KAPPA_BIN_DIR": bindir, "FAKE_LOG": log}
            env.update(extra_env or {})
            r = subprocess.run([entry] + args, env=env, capture_output=True, text=True)
            if r.returncode != want_rc:
                errors.append(f"{args} {extra_env or ''}: exit {r.returncode}, want {want_rc}: {r.stderr}")
            return open(log).read().splitlines()

        def expect(args, want, extra_env=None):
            got = run(args, extra_env)
            if got != want:
                errors.append(f"{args} {extra_env or ''}: ran {got}, want {want}")

        expect(["learner", "--config", "c", "--resume"], ["kappa-learner --config c --resume"])
        expect(["teacher", "--address", "0.0.0.0:1"], ["kappa-teacher --address 0.0.0.0:1"])
        expect(["verifier", "--health-check", "127.0.0.1:3"], ["kappa-verifier --health-check 127.0.0.1:3"])
        expect(["rollout", "--learner", "dns:///learner:50051"], ["kappa-rollout-worker --learner dns:///learner:50051"])
        expect(["kappa", "report", "d"], ["kappa report d"])
        expect(["learner", "x"], ["kappa-learner x"], {"KAPPA_WORLD_SIZE": "1"})
        expect(["learner", "x"], ["kappa-learner x --world-size 4 --rank auto --dist-store tcp://learner-0.learner-peers:29500"],
               {"KAPPA_WORLD_SIZE": "4", "KAPPA_DIST_STORE": "tcp://learner-0.learner-peers:29500"})
        expect(["learner", "x"], ["kappa-learner x --world-size 2 --rank 1"],
               {"KAPPA_WORLD_SIZE": "2", "KAPPA_RANK": "1"})
        expect(["learner", "--world-size", "3"], ["kappa-learner --world-size 3"], {"KAPPA_WORLD_SIZE": "2"})

        boot = ["bootstrap", "--config", config, "--data-dir", data]
        sft = lambda role, extra="": f"kappa sft {config}{extra} --role {role} --out {data}/.{role}.tmp"
        expect(boot, [sft("teacher"), sft("student")])
        for role in ("teacher", "student"):
            if not os.path.exists(os.path.join(data, role, "model.safetensors")):
                errors.append(f"bootstrap left no {data}/{role}/model.safetensors")
            if os.path.exists(os.path.join(data, f".{role}.tmp")):
                errors.append(f"bootstrap left {data}/.{role}.tmp behind")
        expect(boot, [])  # same key: skipped
        expect(boot, [], {"KAPPA_CFG_TRAINER__STEPS": "9"})  # not model-shaping
        expect(boot, [sft("teacher"), sft("student")], {"KAPPA_CFG_TASK__TRAIN_SIZE": "60"})
        expect(boot + ["--role", "student", "seed=3"], [sft("student", " seed=3")])
        run(boot + ["--role", "critic"], want_rc=2)
        with open(config, "a") as f:
            f.write("seed: 2\n")
        run(boot, {"FAKE_SFT_FAIL": "1"}, want_rc=3)
        if not os.path.exists(os.path.join(data, "teacher", "model.safetensors")):
            errors.append("a failed bootstrap removed the previous checkpoint")
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print("ok: entrypoint dispatch, data-parallel flags, bootstrap skip/redo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
