#!/usr/bin/env bash
# Generates the secrets a kappa deployment (Docker Compose or Kubernetes)
# needs to run with TLS, mutual TLS and role tokens (docs/deploy.md,
# "Secrets"):
#
#   bash scripts/deploy_secrets.sh deploy/compose/secrets              # before docker-compose up
#   bash scripts/deploy_secrets.sh --private deploy/k8s/base/secrets   # before kubectl apply -k
#
# usage: deploy_secrets.sh [--force] [--private] [--owner UID:GID] [--days N]
#                          [--san DNS:NAME|IP:ADDR ...] OUT_DIR
#
# Writes into OUT_DIR (mounted read-only at /etc/kappa/secrets in every kappa
# container, and security.tokens_dir there):
#   ca.crt                  the CA every peer's certificate must chain to (security.ca_file)
#   tls.crt, tls.key        one service certificate (ECDSA P-256) signed by that CA,
#                           used by every process as server AND client certificate
#                           (extendedKeyUsage serverAuth + clientAuth; mutual TLS).
#                           SANs: every name a peer dials -- the Compose services
#                           learner, teacher, verifier (+ learner-0, learner-1 of
#                           docker-compose.gpu-dp2.yml), the k8s Services learner,
#                           teacher, verifier, learner-peers and *.learner-peers
#                           (deploy/k8s/base), localhost, 127.0.0.1 and ::1
#                           (healthchecks dial 127.0.0.1); plus each --san.
#   worker.token            32 random bytes as 64 hex digits, no newline: the
#                           `worker` role (Rollout, WatchPolicy, JoinWeightGroup,
#                           teacher Score/Generate, verifier Verify)
#   observer.token          the same for the `observer` role (health, teacher Info)
#   grafana_admin_password  24 random bytes, base64url (Compose's Grafana admin)
# and the CA's private key into the SIBLING directory OUT_DIR-ca/ (ca.key,
# ca.srl): outside OUT_DIR, so no bind mount or Secret of OUT_DIR carries it.
# Keep it to sign more certificates, or delete it; a --force run makes a new CA.
#
# Permissions, and why. The containers run as uid/gid 10001
# (deploy/docker/Dockerfile) and read bind-mounted files with the host's
# owner and mode bits:
#   * run as root (default, e.g. with sudo): OUT_DIR and its files are chowned
#     to --owner (default 10001:10001); OUT_DIR 0750, ca.crt and tls.crt 0444,
#     tls.key, *.token and grafana_admin_password 0440: readable by the
#     containers' user and group only. Compose's Grafana (uid 472) reads its
#     password through `group_add: ["10001"]`.
#   * not root (chown to another uid is impossible): OUT_DIR 0755 and every
#     file 0644, WORLD-READABLE on this host, so that uid 10001 can read them
#     through a bind mount; a warning says so. Use root on a shared host.
#   * --private: owned by whoever runs the script, OUT_DIR 0700, certificates
#     0644, keys/tokens/password 0600. For Kubernetes (only kubectl reads
#     them here; in the cluster the Secret volume's mode and the pods' fsGroup
#     10001 decide) and for local runs as yourself (deploy/compose/local_run.py).
#   * OUT_DIR-ca/ is 0700 and ca.key 0600, owned by whoever runs the script,
#     always: no container reads it.
#
# Refuses to touch an existing OUT_DIR (or OUT_DIR-ca) unless --force, which
# replaces both: new CA, certificate, tokens and password. That is rotation:
# re-run with --force, then restart every kappa service (docs/deploy.md).
# Needs bash and openssl (Debian: openssl).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

force=0
private=0
owner="10001:10001"
days=825
extra_sans=()
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) force=1 ;;
    --private) private=1 ;;
    --owner) owner="${2:?--owner needs UID:GID}"; shift ;;
    --days) days="${2:?--days needs a number}"; shift ;;
    --san) extra_sans+=("${2:?--san needs DNS:NAME or IP:ADDR}"); shift ;;
    -h|--help) usage ;;
    -*) echo "deploy_secrets.sh: unknown option $1" >&2; usage ;;
    *)
      [[ -z "$out" ]] || { echo "deploy_secrets.sh: one OUT_DIR only" >&2; usage; }
      out="$1" ;;
  esac
  shift
done
[[ -n "$out" ]] || usage
[[ "$days" =~ ^[0-9]+$ && "$days" -gt 0 ]] || { echo "deploy_secrets.sh: --days $days is not a positive number" >&2; exit 2; }
[[ "$owner" =~ ^[0-9]+:[0-9]+$ ]] || { echo "deploy_secrets.sh: --owner $owner is not UID:GID" >&2; exit 2; }
for s in "${extra_sans[@]+"${extra_sans[@]}"}"; do
  [[ "$s" =~ ^(DNS|IP):[A-Za-z0-9.*:_-]+$ ]] || { echo "deploy_secrets.sh: --san $s is not DNS:NAME or IP:ADDR" >&2; exit 2; }
done
command -v openssl > /dev/null || { echo "deploy_secrets.sh: openssl not found (apt-get install openssl)" >&2; exit 1; }

out="${out%/}"
ca_dir="${out}-ca"
for d in "$out" "$ca_dir"; do
  if [[ -e "$d" && "$force" != 1 ]]; then
    echo "deploy_secrets.sh: $d exists; pass --force to replace it (new CA, certificate, tokens)" >&2
    exit 1
  fi
done

# Build everything in a fresh temporary directory beside OUT_DIR, then move it
# into place, so a failure leaves no half-written OUT_DIR.
parent="$(dirname "$out")"
mkdir -p "$parent"
umask 077
tmp="$(mktemp -d "$parent/.deploy_secrets.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/out" "$tmp/ca"

sans="DNS:learner,DNS:teacher,DNS:verifier,DNS:learner-0,DNS:learner-1"
sans+=",DNS:learner-peers,DNS:*.learner-peers,DNS:localhost,IP:127.0.0.1,IP:::1"
for s in "${extra_sans[@]+"${extra_sans[@]}"}"; do sans+=",$s"; done

log="$tmp/openssl.log"
run() { "$@" >> "$log" 2>&1 || { echo "deploy_secrets.sh: failed: $*" >&2; cat "$log" >&2; exit 1; }; }

# The CA: ECDSA P-256, 10 years, only for signing certificates.
run openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
  -days 3650 -subj "/O=kappa/CN=kappa deployment CA" \
  -keyout "$tmp/ca/ca.key" -out "$tmp/out/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash"

# The service certificate: server and client (mutual TLS) for every process.
cat > "$tmp/leaf.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
run openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
  -subj "/O=kappa/CN=kappa" -keyout "$tmp/out/tls.key" -out "$tmp/leaf.csr"
run openssl x509 -req -in "$tmp/leaf.csr" -CA "$tmp/out/ca.crt" -CAkey "$tmp/ca/ca.key" \
  -CAserial "$tmp/ca/ca.srl" -CAcreateserial -days "$days" -sha256 \
  -extfile "$tmp/leaf.ext" -out "$tmp/out/tls.crt"
run openssl verify -CAfile "$tmp/out/ca.crt" "$tmp/out/tls.crt"

# Tokens: 32 random bytes as hex, no trailing newline. Password: base64url.
printf '%s' "$(openssl rand -hex 32)" > "$tmp/out/worker.token"
printf '%s' "$(openssl rand -hex 32)" > "$tmp/out/observer.token"
printf '%s' "$(openssl rand -base64 24 | tr '+/' '-_')" > "$tmp/out/grafana_admin_password"

certs=(ca.crt tls.crt)
secrets=(tls.key worker.token observer.token grafana_admin_password)
chmod 0700 "$tmp/ca"
chmod 0600 "$tmp/ca/ca.key" "$tmp/ca/ca.srl"
if [[ "$private" == 1 ]]; then
  chmod 0700 "$tmp/out"
  for f in "${certs[@]}"; do chmod 0644 "$tmp/out/$f"; done
  for f in "${secrets[@]}"; do chmod 0600 "$tmp/out/$f"; done
elif [[ "$(id -u)" == 0 ]]; then
  chown -R "$owner" "$tmp/out"
  chmod 0750 "$tmp/out"
  for f in "${certs[@]}"; do chmod 0444 "$tmp/out/$f"; done
  for f in "${secrets[@]}"; do chmod 0440 "$tmp/out/$f"; done
else
  chmod 0755 "$tmp/out"
  for f in "${certs[@]}" "${secrets[@]}"; do chmod 0644 "$tmp/out/$f"; done
  echo "deploy_secrets.sh: WARNING: not root, so the files cannot be given to uid 10001:" \
       "they are world-readable (0644) for the containers to read them through a bind mount." \
       "Run as root (sudo) for 10001-owned 0440 files, or pass --private for Kubernetes." >&2
fi

rm -rf "$out" "$ca_dir"
mv "$tmp/ca" "$ca_dir"
mv "$tmp/out" "$out"
echo "deploy_secrets.sh: wrote $out/{ca.crt,tls.crt,tls.key,worker.token,observer.token,grafana_admin_password} and $ca_dir/ca.key"
echo "deploy_secrets.sh: certificate names: $sans (valid $days days)"
