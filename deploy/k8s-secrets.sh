#!/bin/sh
# Create the three Secrets the manifests of deploy/k8s/ read, from `ctxstore acl`.
#
#   CTXSTORE_KEY_PREFIX=ctx CTXSTORE_QUEUE_NAME=ctxstore:summaries \
#     deploy/k8s-secrets.sh OUT [--tenant acme ...]
#   kubectl apply -f OUT/secrets.yaml
#
# deploy/k8s/ holds no Secret on purpose: `kubectl apply -f deploy/k8s/` then
# never replaces these with placeholders. Each run makes new passwords for
# every user: apply all three Secrets together, then ACL LOAD and restart the
# workers and agent pods (see deploy/README.md).
#
# Writes, owner-only (umask 077), under OUT (which must not exist yet):
#   creds.json            every user's password, as `ctxstore acl` wrote it; keep it safe
#   ctxstore-redis-acl/   users.acl: the whole ACL file (`default` off, admin,
#                         ctxstore-probe, ctxstore-pod, ctxstore-worker, tenants);
#                         probe-password: ctxstore-probe's, for the Redis probes
#   ctxstore-worker/      CTXSTORE_REDIS_URL, CTXSTORE_QUEUE_URL (as ctxstore-worker),
#                         and ANTHROPIC_API_KEY when it is set here
#   ctxstore-pod/         CTXSTORE_REDIS_URL, CTXSTORE_QUEUE_URL (as ctxstore-pod)
#   secrets.yaml          the three Secrets (kubectl create secret --dry-run=client -o yaml)
# Each file of a Secret's directory is one key of that Secret.
#
# Variables:
#   CTXSTORE_KEY_PREFIX, CTXSTORE_QUEUE_NAME   required: the values of
#       deploy/k8s/10-settings.yaml (the ACL key patterns are built from them)
#   REDIS_ADDRESS   host:port in the URLs
#                   (default: the StatefulSet's pod, see 20-redis.yaml)
#   NAMESPACE       the Secrets' namespace (default: ctxstore)
#   ANTHROPIC_API_KEY   optional: the workers summarize with Anthropic's API
# Needs: ctxstore and python3 on PATH; kubectl for secrets.yaml only.
set -eu

if [ $# -lt 1 ]; then
    echo "usage: CTXSTORE_KEY_PREFIX=... CTXSTORE_QUEUE_NAME=... $0 OUT [--tenant T ...]" >&2
    exit 2
fi
out=$1
shift
: "${CTXSTORE_KEY_PREFIX:?set it to the CTXSTORE_KEY_PREFIX of deploy/k8s/10-settings.yaml}"
: "${CTXSTORE_QUEUE_NAME:?set it to the CTXSTORE_QUEUE_NAME of deploy/k8s/10-settings.yaml}"
address=${REDIS_ADDRESS:-ctxstore-redis-0.ctxstore-redis.ctxstore.svc.cluster.local:6379}
namespace=${NAMESPACE:-ctxstore}

if [ -e "$out" ]; then
    echo "$0: $out exists; give a new directory (the old passwords stay in it)" >&2
    exit 2
fi
umask 077
mkdir -p "$out/ctxstore-redis-acl" "$out/ctxstore-worker" "$out/ctxstore-pod"

ctxstore acl --out "$out/ctxstore-redis-acl/users.acl" --credentials "$out/creds.json" \
    --admin admin --probe ctxstore-probe "$@"

password() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]], end="")' \
        "$out/creds.json" "$1"
}

# The passwords are URL-safe (ctxstore acl makes them so): they go into the URLs as they are.
printf '%s' "$(password ctxstore-probe)" > "$out/ctxstore-redis-acl/probe-password"
for user in worker pod; do
    url="redis://ctxstore-$user:$(password "ctxstore-$user")@$address/0"
    printf '%s' "$url" > "$out/ctxstore-$user/CTXSTORE_REDIS_URL"
    printf '%s' "$url" > "$out/ctxstore-$user/CTXSTORE_QUEUE_URL"
done
if [ -n "${ANTHROPIC_API_KEY:-}" ]; then
    printf '%s' "$ANTHROPIC_API_KEY" > "$out/ctxstore-worker/ANTHROPIC_API_KEY"
fi

if ! command -v kubectl > /dev/null 2>&1; then
    echo "kubectl not found: create each Secret from its directory, e.g." >&2
    echo "  kubectl -n $namespace create secret generic ctxstore-pod --from-file=$out/ctxstore-pod/" >&2
    exit 0
fi
for name in ctxstore-redis-acl ctxstore-worker ctxstore-pod; do
    echo "---"
    kubectl create secret generic "$name" --namespace "$namespace" \
        --from-file="$out/$name/" --dry-run=client -o yaml
done > "$out/secrets.yaml"
echo "wrote $out/secrets.yaml: kubectl apply -f $out/secrets.yaml" >&2
