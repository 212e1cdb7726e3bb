#!/usr/bin/env bash
# Starts the HAPI FHIR JPA server 8.8.0 peer (HapiPeerServer, this folder's pom) for
# loadtest/cmd/peerbench: builds it once (mvn package into target/, made again only when the pom,
# the sources or this script change), starts a fresh PostgreSQL cluster for it under a temporary
# directory (as the postgres system user: Postgres refuses root; loopback TCP on a free port;
# the same durability and sizing as carehub's embedded cluster), starts HAPI on 127.0.0.1, waits
# until GET /fhir/metadata answers 200, prints one line `ready http://127.0.0.1:PORT/fhir` on
# stdout, and runs until HAPI exits or this script is signalled. Everything it started is
# stopped, and the cluster deleted, on exit (EXIT, INT, TERM, HUP).
#
#   loadtest/peers/hapi/run.sh [--build-only]
#
# Environment: HAPI_PORT (default 8090), HAPI_HEAP (JVM -Xms and -Xmx, default 4g), HAPI_POOL
# (HikariCP connections, default 10), CAREHUB_M2_REPO (Maven repository, default
# ~/.cache/carehub/m2), JAVA, PG_BIN (default: the newest /usr/lib/postgresql/*/bin).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
m2=${CAREHUB_M2_REPO:-$HOME/.cache/carehub/m2}
java=${JAVA:-java}
port=${HAPI_PORT:-8090}
heap=${HAPI_HEAP:-4g}
pool=${HAPI_POOL:-10}
jar=$here/target/hapi-peer.jar

log() { echo "hapi-peer: $*" >&2; }

# Build once per pom, sources and script.
stamp=$(cd "$here" && find pom.xml run.sh src -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -d' ' -f1)
if [ ! -f "$jar" ] || [ "$(cat "$here/target/build.stamp" 2>/dev/null)" != "$stamp" ]; then
	command -v mvn >/dev/null || { log "mvn not found (Java 17 and Maven: make test-deps)"; exit 1; }
	log "building (Maven repository $m2; the first build fetches a few hundred MB)"
	mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$m2" -f "$here/pom.xml" package -DskipTests >&2
	echo "$stamp" >"$here/target/build.stamp"
fi
[ "${1:-}" = "--build-only" ] && exit 0

pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[ -x "$pg_bin/pg_ctl" ] || { log "no PostgreSQL binaries under /usr/lib/postgresql (make postgres-binaries)"; exit 1; }
as_pg=()
if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); fi

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d /tmp/carehub-hapi-peer.XXXXXX)
java_pid=
pg_started=
cleanup() {
	trap - EXIT INT TERM HUP
	if [ -n "$java_pid" ] && kill -0 "$java_pid" 2>/dev/null; then
		kill -TERM "$java_pid" 2>/dev/null || true
		for _ in $(seq 1 100); do kill -0 "$java_pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$java_pid" 2>/dev/null || true
		wait "$java_pid" 2>/dev/null || true
	fi
	if [ -n "$pg_started" ]; then
		"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
"${as_pg[@]}" "$pg_bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
	{ cat "$dir/initdb.log" >&2; exit 1; }
pg_port=$(free_port)
# carehub's embedded cluster's settings (storage/postgres/local.go, a durable cluster), so that
# the two servers' databases differ only in what they store: fsync and synchronous commit on,
# shared_buffers an eighth of memory (128 MB to 1 GB), 16 MB of WAL buffers, 2 GB between
# checkpoints, 200 connections. HAPI connects over loopback TCP (carehub over a Unix socket).
mem_mb=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)
sb=$((mem_mb / 8)); [ "$sb" -lt 128 ] && sb=128; [ "$sb" -gt 1024 ] && sb=1024
cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = ${sb}MB
wal_buffers = 16MB
max_wal_size = 2GB
fsync = on
full_page_writes = on
synchronous_commit = on
timezone = 'UTC'
EOF
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w start >/dev/null ||
	{ cat "$dir/postgres.log" >&2; exit 1; }
pg_started=1
"${as_pg[@]}" "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres hapi
log "PostgreSQL on 127.0.0.1:$pg_port (shared_buffers ${sb}MB), data under $dir"

"$java" -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -jar "$jar" \
	--server.port="$port" --server.address=127.0.0.1 \
	--peer.jdbc-url="jdbc:postgresql://127.0.0.1:$pg_port/hapi" --peer.jdbc-user=postgres --peer.pool-size="$pool" \
	>"$dir/hapi.log" 2>&1 &
java_pid=$!
log "HAPI pid $java_pid, log $dir/hapi.log"

url=http://127.0.0.1:$port/fhir
for i in $(seq 1 600); do
	if ! kill -0 "$java_pid" 2>/dev/null; then
		log "HAPI exited before it was ready:"; tail -60 "$dir/hapi.log" >&2; exit 1
	fi
	if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/metadata" 2>/dev/null)" = 200 ]; then
		log "ready after ${i}x0.5 s"
		echo "ready $url pid=$java_pid pgport=$pg_port pgdata=$dir/data"
		break
	fi
	sleep 0.5
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/metadata" 2>/dev/null)" = 200 ] || { log "HAPI not ready after 300 s"; tail -60 "$dir/hapi.log" >&2; exit 1; }

set +e
wait "$java_pid"
rc=$?
java_pid=
log "HAPI exited ($rc)"; tail -20 "$dir/hapi.log" >&2
exit "$rc"
