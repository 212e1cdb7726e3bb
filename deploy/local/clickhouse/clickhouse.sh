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
#   clickhouse.sh url                             the --clickhouse-url of this server
#   clickhouse.sh query SQL                       run SQL over HTTP and print the answer
#
# Environment:
#   CLICKHOUSE_TCP_PORT       native protocol port (default 19000)
#   CLICKHOUSE_HTTP_PORT      HTTP port (default 18123)
#   CLICKHOUSE_STATE_DIR      data, logs, pid (default /tmp/carehub-clickhouse-$CLICKHOUSE_TCP_PORT)
#   CAREHUB_CACHE_DIR         cache root (default $HOME/.cache/carehub)
#   CLICKHOUSE_VERSION        overrides the @chdb/lib-linux-x64-gnu version of package.json
#   CLICKHOUSE_START_TIMEOUT  seconds up waits for the server (default 60)
#   CLICKHOUSE_STOP_TIMEOUT   seconds down waits after SIGTERM before SIGKILL (default 30)
#   CC                        C compiler for the launcher (default cc)
#
# up and down are idempotent; concurrent calls on one state dir serialise on a lock file.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
package=@chdb/lib-linux-x64-gnu
pinned=$(sed -n 's|.*"@chdb/lib-linux-x64-gnu": *"\([^"]*\)".*|\1|p' "$here/package.json")
version=${CLICKHOUSE_VERSION:-$pinned}
cache=${CAREHUB_CACHE_DIR:-$HOME/.cache/carehub}/clickhouse
lib=$cache/$version/libchdb.so
tcp_port=${CLICKHOUSE_TCP_PORT:-19000}
http_port=${CLICKHOUSE_HTTP_PORT:-18123}
state=${CLICKHOUSE_STATE_DIR:-/tmp/carehub-clickhouse-$tcp_port}
start_timeout=${CLICKHOUSE_START_TIMEOUT:-60}
stop_timeout=${CLICKHOUSE_STOP_TIMEOUT:-30}
cc=${CC:-cc}

data=$state/data
logfile=$state/clickhouse.log
pidfile=$state/clickhouse.pid
name=clickhouse where="127.0.0.1:$tcp_port (http $http_port)" ports=("$tcp_port" "$http_port")
# shellcheck source=../daemon.sh
. "$here/../daemon.sh"
# running, not alive: the child started by up may not have exec'd the launcher yet.
starting() { running "$1"; }

say() { printf 'clickhouse.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	exit 2
}

# lock serialises commands that change the server's state on one state dir.
lock() {
	mkdir -p "$state"
	exec 9>"$state/.lock"
	flock 9
}

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
	if [[ -f $cache/$version/.complete ]]; then
		say "$package $version already fetched into $cache/$version"
		return
	fi
	command -v npm >/dev/null || die "npm not found: install Node.js and npm"
	mkdir -p "$cache"
	exec 8>"$cache/.fetch.lock"
	flock 8
	if [[ -f $cache/$version/.complete ]]; then
		return
	fi
	local tmp
	tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
	say "fetching $package $version (about 180 MB) into $cache/$version"
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
	touch "$tmp/out/.complete"
	rm -rf "$cache/$version"
	mv "$tmp/out" "$cache/$version"
	rm -rf "$tmp"
}

# running tells whether process pid has not fully exited. A zombie has closed its sockets, so it
# is not running.
running() {
	local stat st
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	st=${stat##*) }
	st=${st%% *}
	[[ $st != Z && $st != X ]]
}

# alive tells whether pid is a running server of this state dir. A process in the middle of
# exiting has dropped its cmdline but may still hold the ports, so it is alive. A recycled pid
# (another cmdline) is not ours.
alive() {
	local cmd
	running "$1" || return 1
	cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
	[[ -z $cmd || $cmd == *"--path=$data/ "* ]]
}

running_pid() {
	[[ -f $pidfile ]] || return 1
	local pid
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
	echo "$pid"
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

port_taken() {
	timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' taken "$1" 2>/dev/null
}

# probe: the HTTP interface answers /ping and the native port accepts connections.
probe() {
	[[ $(http GET /ping 2>/dev/null) == Ok. ]] && port_taken "$tcp_port"
}

running_version() {
	http POST / 'SELECT version()' 2>/dev/null
}

up() {
	[[ -f $cache/$version/.complete ]] || fetch
	build_launcher
	lock
	local pid
	if pid=$(running_pid); then
		if probe; then
			say "clickhouse $(running_version) already up on 127.0.0.1:$tcp_port (http $http_port, pid $pid)"
			return
		fi
		say "clickhouse (pid $pid) is running but not answering yet; waiting"
		wait_ready "$pid" 0 "logs: $logfile, $state/clickhouse-server.log"
		say "clickhouse $(running_version) up on 127.0.0.1:$tcp_port (http $http_port, pid $pid)"
		return
	fi
	rm -f "$pidfile"
	port_taken "$tcp_port" && die "port $tcp_port is taken by another process (set CLICKHOUSE_TCP_PORT)"
	port_taken "$http_port" && die "port $http_port is taken by another process (set CLICKHOUSE_HTTP_PORT)"
	mkdir -p "$data"
	if [[ -f $logfile ]] && (($(stat -c %s "$logfile") > 50 << 20)); then
		mv -f "$logfile" "$logfile.1"
	fi
	touch "$logfile"
	local offset t0
	offset=$(stat -c %s "$logfile")
	t0=$(date +%s%N)
	echo "=== clickhouse.sh up $(date -Is) ===" >>"$logfile"
	# setsid: the server must not die with the shell or make recipe that started it; down is
	# the way to stop it. It must not inherit the lock fds either, or it would hold the lock for
	# its whole life. --path ends in a slash: alive() matches the cmdline on it.
	setsid "$(launcher)" "$lib" \
		--path="$data/" \
		--listen_host=127.0.0.1 --tcp_port="$tcp_port" --http_port="$http_port" \
		--logger.log="$state/clickhouse-server.log" --log-level=information \
		-- --logger.size=50M --logger.count=2 --logger.console=0 \
		>>"$logfile" 2>&1 </dev/null 8>&- 9>&- &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_ready "$pid" "$offset" "logs: $logfile, $state/clickhouse-server.log"
	local ms=$((($(date +%s%N) - t0) / 1000000))
	say "clickhouse $(running_version) up on 127.0.0.1:$tcp_port (http $http_port, pid $pid, state $state, ${ms} ms)"
}

status() {
	local pid
	if pid=$(running_pid); then
		if probe; then
			echo "up: clickhouse $(running_version) on 127.0.0.1:$tcp_port (http $http_port, pid $pid, state $state)"
			return 0
		fi
		echo "running but not answering: pid $pid on 127.0.0.1:$tcp_port (log $logfile)"
		return 1
	fi
	echo "down: 127.0.0.1:$tcp_port (state $state)"
	return 3
}

show_version() {
	local v
	if running_pid >/dev/null && v=$(running_version); then
		echo "$package $version (engine $v)"
	else
		echo "$package $version"
	fi
}

query() {
	(($# == 1)) || usage
	http POST / "$1"
}

cmd=${1:-}
shift || true
case $cmd in
fetch) fetch ;;
up) up ;;
down) down ;;
restart) restart "$@" ;;
status) status ;;
version) show_version ;;
url) echo "clickhouse://127.0.0.1:$tcp_port/default" ;;
query) query "$@" ;;
*) usage ;;
esac
