# daemon.sh: what deploy/local/kafka/kafka.sh and deploy/local/clickhouse/clickhouse.sh share,
# sourced by both: the commands' messages, lock and usage, the process bookkeeping (pid file,
# liveness, ports), starting, waiting for the process to answer, stopping, restarting, status and
# the command dispatch (main).
#
# The sourcing script sets name (kafka), where (127.0.0.1:9092), ports (every port it listens
# on) and port_vars (the variable setting each), mark (what the process's command line
# contains: its state dir), logs (the logs a failure points to), state, pidfile, logfile,
# start_timeout and stop_timeout, cache and engine (the cache directory that holds the engine
# once fetched) and what (what is fetched), and defines probe (it answers), starting PID (the
# process started by up runs, or is about to), prepare (what up needs before the lock: fetch,
# check), launch (start the process in the background: setsid, without fds 8 and 9),
# running_version [LOG OFFSET], download TMP (fetch_engine's download into TMP/out), fetch and
# show_version, and may define provision (what up does once the process answers). A command of
# its own, NAME, is a function cmd_NAME.

say() { printf '%s.sh: %s\n' "$name" "$*" >&2; }
die() { say "$*"; exit 1; }

# Every checkout on a machine runs engines of its own: their state lives under the checkout's
# .local/ (git-ignored) and their default ports come from a hash of its path, so one checkout's
# down never stops another's engine and no checkout's node reads another's data.
checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
checkout_id=$(printf %s "$checkout" | sha256sum | cut -c1-8)
# port_base: a block of eight ports per checkout (Kafka +0 and +1, ClickHouse +2 and +3, the
# scale-out test's Kafka +4 and +5) in 20000-29999, below Linux's ephemeral range, where the
# kernel picks the local ports of outgoing connections.
port_base=$((20000 + 8 * (16#$checkout_id % 1250)))

provision() { :; }

# holder PORT names who listens on PORT: "NAME (pid PID)" when ss can tell, else "another process".
holder() {
	local who
	who=$(ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\).*/\1 (pid \2)/p' | head -1)
	echo "${who:-another process}"
}

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[-1]}" | sed '$d; s/^# \{0,1\}//'
	exit 2
}

# lock serialises commands that change the process's state on one state dir.
lock() {
	mkdir -p "$state"
	exec 9>"$state/.lock"
	flock 9
}

# fetch_engine downloads the engine into the cache once: download TMP fills TMP/out (and dies,
# removing TMP, when it cannot), which then becomes $engine. Concurrent fetches wait on a lock.
fetch_engine() {
	if [[ -f $engine/.complete ]]; then
		say "$what already fetched into $engine"
		return
	fi
	mkdir -p "$cache"
	exec 8>"$cache/.fetch.lock"
	flock 8
	if [[ -f $engine/.complete ]]; then
		return
	fi
	local tmp
	tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
	say "fetching $what into $engine"
	download "$tmp"
	touch "$tmp/out/.complete"
	rm -rf "$engine"
	mkdir -p "$(dirname "$engine")"
	mv "$tmp/out" "$engine"
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

# alive tells whether pid is a running process of this state dir. A process in the middle of
# exiting has dropped its cmdline but may still hold the ports, so it is alive. A child of this
# script is too: until it has exec'd the engine its cmdline is still this shell's (on a loaded
# machine that lasts long enough for wait_ready to see it, and to call a starting engine dead).
# A recycled pid (another cmdline, another parent) is not ours.
alive() {
	local cmd stat ppid
	running "$1" || return 1
	cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
	[[ -z $cmd || $cmd == *"$mark"* ]] && return 0
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	read -r _ ppid _ <<<"$stat"
	[[ $ppid == "$$" ]]
}

running_pid() {
	[[ -f $pidfile ]] || return 1
	local pid
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
	echo "$pid"
}

port_taken() {
	timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' taken "$1" 2>/dev/null
}

# wait_ready PID OFFSET: polls probe until it answers; dies with the log since OFFSET when the
# process exits, or with the log's tail after start_timeout.
wait_ready() {
	local pid=$1 offset=$2 deadline=$((SECONDS + start_timeout))
	until probe; do
		if ! starting "$pid"; then
			rm -f "$pidfile"
			tail -c +$((offset + 1)) "$logfile" | tail -n 40 >&2
			die "$name exited during startup; $logs"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 40 "$logfile" >&2
			die "$name did not answer on $where within ${start_timeout}s (pid $pid left running; log: $logfile)"
		fi
		sleep 0.05
	done
}

# up starts the process unless it runs, waits until it answers, and provisions it.
up() {
	start
	provision
}

start() {
	prepare
	lock
	local pid
	if pid=$(running_pid); then
		if probe; then
			say "$name $(running_version) already up on $where (pid $pid)"
			return
		fi
		say "$name (pid $pid) is running but not answering yet; waiting"
		wait_ready "$pid" 0
		say "$name $(running_version) up on $where (pid $pid)"
		return
	fi
	rm -f "$pidfile"
	local i
	for i in "${!ports[@]}"; do
		port_taken "${ports[i]}" &&
			die "port ${ports[i]} is held by $(holder "${ports[i]}"); choose another: make $name-up ${port_vars[i]}=PORT"
	done
	mkdir -p "$state"
	if [[ -f $logfile ]] && (($(stat -c %s "$logfile") > 50 << 20)); then
		mv -f "$logfile" "$logfile.1"
	fi
	touch "$logfile"
	local offset t0
	offset=$(stat -c %s "$logfile")
	t0=$(date +%s%N)
	launch
	pid=$!
	echo "$pid" >"$pidfile"
	wait_ready "$pid" "$offset"
	local ms=$((($(date +%s%N) - t0) / 1000000))
	say "$name $(running_version "$offset") up on $where (pid $pid, state $state, ${ms} ms)"
}

# stop SIG: signals the process and waits for it to exit and free its ports; if it outlasts
# stop_timeout it is killed.
stop() {
	local sig=$1 pid
	if ! pid=$(running_pid); then
		rm -f "$pidfile"
		say "$name on $where is not running"
		return
	fi
	kill -"$sig" "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + stop_timeout))
	while alive "$pid"; do
		if ((SECONDS >= deadline)); then
			say "$name (pid $pid) still running ${stop_timeout}s after SIG$sig; killing"
			kill -KILL "$pid" 2>/dev/null || true
			deadline=$((SECONDS + 10))
			sig=KILL
		fi
		sleep 0.05
	done
	rm -f "$pidfile"
	# The kernel may take a moment to release the listeners of a killed process.
	local i p taken
	for ((i = 0; i < 100; i++)); do
		taken=
		for p in "${ports[@]}"; do
			port_taken "$p" && taken=1
		done
		[[ -z $taken ]] && break
		sleep 0.1
	done
	say "$name (pid $pid) stopped with SIG$sig"
}

down() {
	lock
	stop TERM
}

# restart [--signal TERM|KILL]: stops the process with the signal, then starts it again.
restart() {
	local sig=TERM
	while (($#)); do
		case $1 in
		--signal) sig=${2:-}; shift 2 || usage ;;
		--signal=*) sig=${1#--signal=}; shift ;;
		*) usage ;;
		esac
	done
	sig=${sig#SIG}
	[[ $sig == TERM || $sig == KILL ]] || die "restart --signal takes TERM or KILL, not $sig"
	lock
	stop "$sig"
	exec 9>&-
	up
}

# status: exit 0 up, 1 running but not answering, 3 down.
status() {
	local pid
	if pid=$(running_pid); then
		if probe; then
			echo "up: $name $(running_version) on $where (pid $pid, state $state)"
			return 0
		fi
		echo "running but not answering: pid $pid on $where (log $logfile)"
		return 1
	fi
	echo "down: $where (state $state)"
	return 3
}

# main CMD [ARG...] runs one command: fetch, up, down, restart, status, version or one of the
# script's own (cmd_CMD).
main() {
	local cmd=${1:-}
	shift || true
	case $cmd in
	fetch) fetch ;;
	up) up ;;
	down) down ;;
	restart) restart "$@" ;;
	status) status ;;
	version) show_version ;;
	*)
		[[ $cmd =~ ^[a-z]+$ ]] && declare -F "cmd_$cmd" >/dev/null || usage
		"cmd_$cmd" "$@"
		;;
	esac
}
