#!/usr/bin/env bash
# Generates the cluster secret every troupe process proves before it is let
# in (README "Security"): a Kubernetes Secret `troupe-secret` (key `secret`)
# holding 32 random bytes as hex, made here and never written to a file.
# troupe refuses placeholder and guessable secrets, so no value ships with
# these manifests. An existing Secret is kept (pods that run with it would
# lose their peers); delete it first to make a new one.
#   deploy/kubernetes/make-secret.sh [NAMESPACE]
set -euo pipefail
ns=(${1:+--namespace "$1"})
if kubectl get secret troupe-secret "${ns[@]}" >/dev/null 2>&1; then
  echo "make-secret.sh: Secret troupe-secret exists; kept" >&2
  exit 0
fi
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
[[ ${#secret} -eq 64 ]] || { echo "make-secret.sh: could not read /dev/urandom" >&2; exit 1; }
kubectl create secret generic troupe-secret "${ns[@]}" --from-literal=secret="$secret"
