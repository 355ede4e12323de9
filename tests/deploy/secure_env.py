"""The security settings every kappa container of the shipped deploys must
carry (Compose and Kubernetes alike), as KAPPA_CFG_ environment overrides:
TLS, mutual TLS and role tokens from the secrets that scripts/deploy_secrets.sh
makes, mounted read-only at SECRETS (docs/deploy.md, docs/security.md).
Shared by check_compose.py and check_k8s.py."""

SECRETS = "/etc/kappa/secrets"
SECURITY_ENV = {"KAPPA_CFG_SECURITY__TLS": "true", "KAPPA_CFG_SECURITY__MUTUAL_TLS": "true",
                "KAPPA_CFG_SECURITY__CERT_FILE": f"{SECRETS}/tls.crt",
                "KAPPA_CFG_SECURITY__KEY_FILE": f"{SECRETS}/tls.key",
                "KAPPA_CFG_SECURITY__CA_FILE": f"{SECRETS}/ca.crt",
                "KAPPA_CFG_SECURITY__TOKEN_FILE": f"{SECRETS}/worker.token",
                "KAPPA_CFG_SECURITY__TOKENS_DIR": SECRETS}
