#!/usr/bin/env bash
# Creates the MLServer venv used by processors/inference/oip's tests:
#   ${MLSERVER_VENV:-$HOME/.cache/carehub/mlserver-venv}
# Idempotent: the venv keeps a copy of the requirements.txt it was built from and is
# re-created only when tests/mlserver/requirements.txt differs from that copy.
# PYTHON (default python3.11, else python3) must be Python 3.11.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reqs="$here/requirements.txt"
venv="${MLSERVER_VENV:-$HOME/.cache/carehub/mlserver-venv}"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"

if cmp -s "$reqs" "$venv/requirements.txt" && [ -x "$venv/bin/mlserver" ]; then
	echo "mlserver venv up to date: $venv"
	exit 0
fi
ver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$ver" != "3.11" ]; then
	echo "setup.sh: $python is Python $ver; requirements.txt is pinned for Python 3.11 (set PYTHON=...)" >&2
	exit 1
fi
echo "creating mlserver venv: $venv"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs"
cp "$reqs" "$venv/requirements.txt"
"$venv/bin/mlserver" --version
