#!/usr/bin/env bash
# clickhouse.sh runs a ClickHouse engine on 127.0.0.1 for carehub's tests and local runs: chDB's
# libchdb.so (clickhouse-local as a library, from npm) loaded by launcher.c, serving the native
# TCP and HTTP protocols.
#
#   clickhouse.sh fetch                           libchdb.so into the cache (npm), launcher built (cc), once
#   clickhouse.sh up                              start, wait until /ping answers and the TCP port accepts
#   clickhouse.sh down                            SIGTERM (clean shutdown), SIGKILL after a timeout
#   clickhouse.sh restart [--signal TERM|KILL]    stop with that signal, start on the same data
#   clickhouse.sh status                          exit 0 up, 1 running but not answering, 3 down
#   clickhouse.sh version                         the package pinned, and the engine's version when up
#   clickhouse.sh url                             the --clickhouse-url of this server and database
#   clickhouse.sh query SQL                       run SQL over HTTP and print the answer
#
# Environment (the defaults are the checkout's own: see daemon.sh):
#   CLICKHOUSE_TCP_PORT       native protocol port (default the checkout's, in 20000-29999)
#   CLICKHOUSE_HTTP_PORT      HTTP port (default the checkout's, the TCP port's default + 1)
#   CLICKHOUSE_STATE_DIR      data, logs, pid (default .local/clickhouse-$CLICKHOUSE_TCP_PORT in the checkout)
#   CLICKHOUSE_DATABASE       the database up creates and url names (default carehub_<hash of the checkout's path>)
#   CAREHUB_CACHE_DIR         cache root (default $HOME/.cache/carehub)
#   CLICKHOUSE_VERSION        overrides the @chdb/lib-linux-x64-gnu version of package.json
#   CLICKHOUSE_START_TIMEOUT  seconds up waits for the server (default 60)
#   CLICKHOUSE_STOP_TIMEOUT   seconds down waits after SIGTERM before SIGKILL (default 30)
#   CC                        C compiler for the launcher (default cc)
#
# up and down are idempotent; concurrent calls on one state dir serialise on a lock file.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=clickhouse
# shellcheck source=../daemon.sh
. "$here/../daemon.sh"
package=@chdb/lib-linux-x64-gnu
pinned=$(sed -n 's|.*"@chdb/lib-linux-x64-gnu": *"\([^"]*\)".*|\1|p' "$here/package.json")
version=${CLICKHOUSE_VERSION:-$pinned}
cache=${CAREHUB_CACHE_DIR:-$HOME/.cache/carehub}/clickhouse
lib=$cache/$version/libchdb.so
engine=$cache/$version what="$package $version"
tcp_port=${CLICKHOUSE_TCP_PORT:-$((port_base + 2))}
http_port=${CLICKHOUSE_HTTP_PORT:-$((port_base + 3))}
state=${CLICKHOUSE_STATE_DIR:-$checkout/.local/clickhouse-$tcp_port}
database=${CLICKHOUSE_DATABASE:-carehub_$checkout_id}
[[ $database =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "CLICKHOUSE_DATABASE=$database: letters, digits and _ only"
start_timeout=${CLICKHOUSE_START_TIMEOUT:-60}
stop_timeout=${CLICKHOUSE_STOP_TIMEOUT:-30}
cc=${CC:-cc}

data=$state/data
logfile=$state/clickhouse.log
pidfile=$state/clickhouse.pid
where="127.0.0.1:$tcp_port, http $http_port" ports=("$tcp_port" "$http_port")
port_vars=(CLICKHOUSE_TCP_PORT CLICKHOUSE_HTTP_PORT)
# --path ends in a slash: alive() matches the cmdline on it.
mark="--path=$data/ " logs="logs: $logfile, $state/clickhouse-server.log"
# running, not alive: the child started by up may not have exec'd the launcher yet.
starting() { running "$1"; }

# launcher is the path of the launcher built from this launcher.c: a new source gets a new
# binary, so a checkout of another revision never runs a stale one.
launcher() {
	echo "$cache/bin/carehub-clickhouse-$(sha256sum "$here/launcher.c" | cut -c1-12)"
}

build_launcher() {
	local bin
	bin=$(launcher)
	[[ -x $bin ]] && return
	command -v "$cc" >/dev/null || die "$cc not found: the launcher needs a C compiler (apt-get install gcc)"
	mkdir -p "$cache/bin"
	"$cc" -O2 -Wall -Wextra -o "$bin.$$" "$here/launcher.c" -ldl || die "could not compile $here/launcher.c"
	mv -f "$bin.$$" "$bin"
}

fetch() {
	build_launcher
	fetch_engine
}

download() {
	local tmp=$1
	command -v npm >/dev/null || { rm -rf "$tmp"; die "npm not found: install Node.js and npm"; }
	# A private npm cache: the tarball is unpacked once here, not kept twice in ~/.npm.
	local npm=(npm --prefix "$tmp" --cache "$tmp/.npm" --no-audit --no-fund --ignore-scripts --loglevel=error)
	if [[ $version == "$pinned" ]]; then
		# The lockfile pins the tarball's integrity.
		cp "$here/package.json" "$here/package-lock.json" "$tmp/"
		"${npm[@]}" ci >&2 || { rm -rf "$tmp"; die "npm could not fetch $package $version"; }
	else
		"${npm[@]}" install --no-save "$package@$version" >&2 || { rm -rf "$tmp"; die "npm could not fetch $package $version"; }
	fi
	mkdir -p "$tmp/out"
	mv "$tmp/node_modules/$package/libchdb.so" "$tmp/out/" || { rm -rf "$tmp"; die "libchdb.so missing from $package $version"; }
}

# http sends one HTTP/1.0 request from bash (no curl needed) and prints the body; it fails
# unless the status is 200. http GET /ping, or http POST / 'SELECT 1'.
http() {
	timeout 10 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		LC_ALL=C
		printf "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" "$2" "$3" "${#4}" "$4" >&3
		IFS= read -r status <&3
		[[ $status == "HTTP/1."?" 200 "* ]] && ok=1 || ok=
		while IFS= read -r line <&3 && [[ $line != $'\''\r'\'' ]]; do :; done
		cat <&3
		[[ -n $ok ]]
	' http "$http_port" "$1" "$2" "${3:-}"
}

# probe: the HTTP interface answers /ping and the native port accepts connections.
probe() {
	[[ $(http GET /ping 2>/dev/null) == Ok. ]] && port_taken "$tcp_port"
}

running_version() {
	http POST / 'SELECT version()' 2>/dev/null
}

prepare() {
	[[ -f $cache/$version/.complete ]] || fetch
	build_launcher
}

launch() {
	mkdir -p "$data"
	echo "=== clickhouse.sh up $(date -Is) ===" >>"$logfile"
	# setsid: the server must not die with the shell or make recipe that started it; down is
	# the way to stop it. It must not inherit the lock fds either, or it would hold the lock for
	# its whole life.
	setsid "$(launcher)" "$lib" \
		--path="$data/" \
		--listen_host=127.0.0.1 --tcp_port="$tcp_port" --http_port="$http_port" \
		--logger.log="$state/clickhouse-server.log" --log-level=information \
		-- --logger.size=50M --logger.count=2 --logger.console=0 \
		>>"$logfile" 2>&1 </dev/null 8>&- 9>&- &
}

show_version() {
	local v
	if running_pid >/dev/null && v=$(running_version); then
		echo "$package $version (engine $v)"
	else
		echo "$package $version"
	fi
}

# provision: the database url names exists once up returns; a node does not create it.
provision() {
	http POST / "CREATE DATABASE IF NOT EXISTS $database" >/dev/null || die "could not create database $database; $logs"
	say "url: $(cmd_url)"
}

cmd_url() { echo "clickhouse://127.0.0.1:$tcp_port/$database"; }

cmd_query() {
	(($# == 1)) || usage
	http POST / "$1"
}

main "$@"
