# daemon.sh: what deploy/local/kafka/kafka.sh and deploy/local/clickhouse/clickhouse.sh share,
# sourced by both: waiting for the started process to answer, stopping and restarting it.
#
# The sourcing script sets name (kafka), where (127.0.0.1:9092), ports (every port it listens
# on), pidfile, logfile, start_timeout and stop_timeout, and defines say, die, probe (it
# answers), running_pid (the recorded process, if it runs), alive PID (the process runs),
# starting PID (the process started by up runs, or is about to), lock (fd 9), usage and up.

# wait_ready PID OFFSET HINT: polls probe until it answers; dies with the log since OFFSET when
# the process exits, or with the log's tail after start_timeout. HINT names what to read.
wait_ready() {
	local pid=$1 offset=$2 hint=$3 deadline=$((SECONDS + start_timeout))
	until probe; do
		if ! starting "$pid"; then
			rm -f "$pidfile"
			tail -c +$((offset + 1)) "$logfile" | tail -n 40 >&2
			die "$name exited during startup; $hint"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 40 "$logfile" >&2
			die "$name did not answer on $where within ${start_timeout}s (pid $pid left running; log: $logfile)"
		fi
		sleep 0.05
	done
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
