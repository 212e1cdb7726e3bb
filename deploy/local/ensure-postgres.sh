#!/usr/bin/env bash
# Installs the PostgreSQL server binaries with apt-get when none are present. carehub runs its own
# cluster from them (initdb, pg_ctl); it does not use the Debian service.
set -euo pipefail
if compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "PostgreSQL server binaries are missing: run 'sudo apt-get install -y postgresql'" >&2
	exit 1
fi
echo "installing PostgreSQL server binaries (apt-get install postgresql)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# The package starts a system cluster; carehub does not use it.
(command -v service >/dev/null && service postgresql stop) >/dev/null 2>&1 || true
