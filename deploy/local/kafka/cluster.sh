#!/usr/bin/env bash
# cluster.sh runs a local three-node Apache Kafka cluster on 127.0.0.1: KRaft, each
# node broker and controller (ids 1-3), started by kafka.sh from the same fetched
# jars, with replication factor 3 and min.insync.replicas 2, for the fault tests.
#
#   cluster.sh up                             format once with one cluster id, start the
#                                             three, wait until each lists 3 live brokers
#   cluster.sh down                           stop the three (SIGTERM, SIGKILL after a timeout)
#   cluster.sh brokers                        the --kafka-brokers of the cluster
#   cluster.sh kill N [--signal KILL|TERM]    stop node N (default SIGKILL), return once it is gone
#   cluster.sh start N                        start node N again on its storage, wait until it answers
#   cluster.sh status                         a line a node; exit 0 all up, 3 all down, else 1
#   cluster.sh pid N                          node N's pid (exit 3 when down)
#
# Environment (the defaults are the checkout's own: see daemon.sh):
#   KAFKA_CLUSTER_PORT       node N's client port is PORT+2(N-1), its controller port the
#                            next one (default the checkout's block of daemon.sh, 10000
#                            lower: in 10000-19999, clear of kafka.sh's and clickhouse.sh's)
#   KAFKA_CLUSTER_HOST       address of every node (default 127.0.0.1)
#   KAFKA_CLUSTER_STATE_DIR  cluster id, node<N>/ of each node's kafka.sh state (default
#                            .local/kafka-cluster-$KAFKA_CLUSTER_PORT in the checkout)
#   KAFKA_CLUSTER_RACKS      comma-separated broker.rack of nodes 1, 2, 3 (default none)
#   KAFKA_REPLICATION        default.replication.factor and the internal topics' (default 3)
#   KAFKA_MIN_ISR            min.insync.replicas and the internal topics' min ISR (default 2)
#   KAFKA_HEAP_OPTS          JVM heap flags of each node (default -Xms128m -Xmx512m)
#   KAFKA_JVM_OPTS           more JVM flags of each node (default -XX:TieredStopAtLevel=1)
#   KAFKA_START_TIMEOUT      seconds up and start wait (default 120: three JVMs start at once)
#   and kafka.sh's CAREHUB_CACHE_DIR, KAFKA_VERSION, KAFKA_STOP_TIMEOUT, JAVA_HOME.
#
# up and down are idempotent; concurrent ups and downs of one state dir serialise on a lock.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=cluster
# shellcheck source=../daemon.sh
. "$here/../daemon.sh"
kafka=$here/kafka.sh
port=${KAFKA_CLUSTER_PORT:-$((port_base - 10000))}
host=${KAFKA_CLUSTER_HOST:-127.0.0.1}
state=${KAFKA_CLUSTER_STATE_DIR:-$checkout/.local/kafka-cluster-$port}
IFS=, read -r -a racks <<<"${KAFKA_CLUSTER_RACKS:-}"
export KAFKA_REPLICATION=${KAFKA_REPLICATION:-3} KAFKA_MIN_ISR=${KAFKA_MIN_ISR:-2}
export KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}
# Three JVMs start at once, often on two cores: compiling with C1 alone halves each one's
# start-up CPU (10 s to 5 s measured), and a test cluster's load is light.
export KAFKA_JVM_OPTS=${KAFKA_JVM_OPTS--XX:TieredStopAtLevel=1}
export KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-120}
nodes=(1 2 3)
voters=
for n in "${nodes[@]}"; do
	voters+=${voters:+,}$n@$host:$((port + 2 * n - 1))
done

# node N CMD [ARG...] runs kafka.sh CMD as node N of the cluster.
node() {
	local n=$1
	shift
	KAFKA_NODE_ID=$n KAFKA_HOST=$host KAFKA_QUORUM_VOTERS=$voters \
		KAFKA_PORT=$((port + 2 * n - 2)) KAFKA_CONTROLLER_PORT=$((port + 2 * n - 1)) \
		KAFKA_STATE_DIR=$state/node$n KAFKA_RACK=${racks[n - 1]:-} \
		KAFKA_CLUSTER_ID=$(cat "$state/cluster.id" 2>/dev/null) "$kafka" "$@"
}

node_arg() {
	[[ ${1:-} =~ ^[123]$ ]] || die "no node ${1:-}: the nodes are 1, 2 and 3"
}

# free_ports N dies when another process holds one of node N's ports (unless node N runs).
free_ports() {
	local n=$1 p
	node "$n" pid >/dev/null && return
	for p in $((port + 2 * n - 2)) $((port + 2 * n - 1)); do
		port_taken "$p" &&
			die "port $p is held by $(holder "$p"); choose another: make kafka-cluster-up KAFKA_CLUSTER_PORT=PORT"
	done
	return 0
}

# all CMD runs kafka.sh CMD on the three nodes at once (a node of a three-voter quorum
# cannot finish starting alone), then prints their messages node by node; it fails when
# one failed.
all() {
	local n failed=
	local -a pids
	for n in "${nodes[@]}"; do
		node "$n" "$1" >"$state/node$n.out" 2>&1 &
		pids[n]=$!
	done
	for n in "${nodes[@]}"; do
		wait "${pids[n]}" || failed+=" $n"
		sed "s/^/node $n: /" "$state/node$n.out" >&2
		rm -f "$state/node$n.out"
	done
	[[ -z $failed ]] || die "$1 failed on node$failed; logs: $state/node*/kafka.log"
}

# wait_cluster waits until every running node lists the three brokers as live.
wait_cluster() {
	local deadline=$((SECONDS + KAFKA_START_TIMEOUT)) n ids
	for n in "${nodes[@]}"; do
		until ids=$(node "$n" live 2>/dev/null) && (($(wc -l <<<"$ids") == ${#nodes[@]})); do
			((SECONDS < deadline)) ||
				die "node $n lists live brokers ${ids//$'\n'/ } after ${KAFKA_START_TIMEOUT}s, not 1 2 3; logs: $state/node*/kafka.log"
			sleep 0.2
		done
	done
}

cluster_up() {
	node 1 prepare
	lock
	if [[ ! -s $state/cluster.id ]]; then
		# A Kafka Uuid, as kafka.sh makes one: never starting with "-", an option to the formatter.
		local cid=-
		while [[ $cid == -* ]]; do
			cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
		done
		echo -n "$cid" >"$state/cluster.id"
	fi
	local n t0
	for n in "${nodes[@]}"; do
		free_ports "$n"
	done
	t0=$(date +%s%N)
	all up
	wait_cluster
	say "3 brokers up on $(brokers) (state $state, $((($(date +%s%N) - t0) / 1000000)) ms)"
}

cluster_down() {
	lock
	all down
}

brokers() {
	local n list=
	for n in "${nodes[@]}"; do
		list+=${list:+,}$host:$((port + 2 * n - 2))
	done
	echo "$list"
}

kill_node() {
	local n=${1:-} sig=KILL
	node_arg "$n"
	shift
	while (($#)); do
		case $1 in
		--signal) sig=${2:-}; shift 2 || usage ;;
		--signal=*) sig=${1#--signal=}; shift ;;
		*) usage ;;
		esac
	done
	case ${sig#SIG} in
	KILL) node "$n" kill ;;
	TERM) node "$n" down ;;
	*) die "kill --signal takes KILL or TERM, not $sig" ;;
	esac
}

start_node() {
	local n=${1:-}
	node_arg "$n"
	[[ -s $state/cluster.id ]] || die "no cluster in $state: run cluster.sh up first"
	free_ports "$n"
	node "$n" up
}

cluster_status() {
	local n out rc up=0 down=0
	for n in "${nodes[@]}"; do
		rc=0
		out=$(node "$n" status) || rc=$?
		echo "node $n: $out"
		case $rc in
		0) up=$((up + 1)) ;;
		3) down=$((down + 1)) ;;
		esac
	done
	if ((up == ${#nodes[@]})); then
		return 0
	elif ((down == ${#nodes[@]})); then
		return 3
	fi
	return 1
}

cmd=${1:-}
shift || true
case $cmd in
up) cluster_up ;;
down) cluster_down ;;
brokers) brokers ;;
kill) kill_node "$@" ;;
start) start_node "$@" ;;
status) cluster_status ;;
pid)
	node_arg "${1:-}"
	node "$1" pid
	;;
*) usage ;;
esac
