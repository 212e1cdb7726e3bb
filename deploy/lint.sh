#!/usr/bin/env bash
# lint.sh checks the deployment files with the real tools, offline once they are installed:
#   the Dockerfile with hadolint,
#   deploy/compose/compose.yaml (and its Kafka-cluster override) against the Compose specification's JSON schema,
#   deploy/helm/carehub with helm lint, and rendered (with its defaults, and with every role and
#   optional object on: ci/*.yaml) then validated against the Kubernetes schemas, strictly.
# `make lint-deploy` installs the tools (DEPLOY_VENV, HELM) and runs it. Timings per step on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${DEPLOY_VENV:?set DEPLOY_VENV to the venv of deploy/requirements.txt}
helm=${HELM:?set HELM to a helm binary}
kube_version=${KUBE_VERSION:-1.34.0}
chart=deploy/helm/carehub
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

step() {
	local name=$1 t0=$SECONDS
	shift
	"$@" || { echo "lint.sh: $name failed" >&2; exit 1; }
	echo "lint.sh: $name ok ($((SECONDS - t0)) s)" >&2
}

render_and_validate() {
	local name=$1
	shift
	"$helm" template carehub "$chart" --kube-version "$kube_version" "$@" >"$out/$name.yaml"
	# kubernetes-validate knows the built-in kinds (--no-warn: the ServiceMonitor, a CRD, is
	# rendered and parsed only; its schema is not available offline).
	"$venv/bin/kubernetes-validate" --strict --quiet --no-warn -k "$kube_version" "$out/$name.yaml"
}

step "hadolint Dockerfile" "$venv/bin/hadolint" --failure-threshold info Dockerfile
step "compose schema" "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose/compose.yaml deploy/compose/compose.kafka-cluster.yaml
step "helm lint (defaults)" "$helm" lint --strict --kube-version "$kube_version" "$chart"
step "chart with defaults" render_and_validate defaults
for values in "$chart"/ci/*.yaml; do
	step "helm lint ($(basename "$values"))" "$helm" lint --strict --kube-version "$kube_version" "$chart" -f "$values"
	step "chart with $(basename "$values")" render_and_validate "$(basename "$values" .yaml)" -f "$values"
done
