#!/usr/bin/env bash
# kafka.sh runs one Apache Kafka node (KRaft, combined broker and controller)
# on 127.0.0.1 for carehub's tests and local runs: a cluster of one by default,
# or one node of cluster.sh's three.
#
#   kafka.sh fetch                           jars into the cache (Maven), once
#   kafka.sh up                              format once, start, wait until it answers metadata
#   kafka.sh down                            SIGTERM (controlled shutdown), SIGKILL after a timeout
#   kafka.sh restart [--signal TERM|KILL]    stop with that signal, start on the same storage
#   kafka.sh status                          exit 0 up, 1 running but not answering, 3 down
#   kafka.sh version                         the version fetched/started
#   kafka.sh brokers                         the --kafka-brokers of this broker
#   kafka.sh live                            node ids of the live brokers this one reports
#   kafka.sh kill                            SIGKILL the broker, return once it is gone
#   kafka.sh pid                             the broker's pid (exit 3 when down)
#   kafka.sh prepare                         fetch (once) and check Java, as up does first
#
# Environment (the defaults are the checkout's own: see daemon.sh):
#   KAFKA_PORT             client port (default the checkout's, in 20000-29999)
#   KAFKA_CONTROLLER_PORT  controller port (default KAFKA_PORT+1)
#   KAFKA_STATE_DIR        config, data, log, pid (default .local/kafka-$KAFKA_PORT in the checkout)
#   CAREHUB_CACHE_DIR      jar cache root (default $HOME/.cache/carehub)
#   KAFKA_VERSION          overrides kafka.version in pom.xml
#   KAFKA_START_TIMEOUT    seconds up waits for the broker (default 60)
#   KAFKA_STOP_TIMEOUT     seconds down waits after SIGTERM before SIGKILL (default 30)
#   KAFKA_HEAP_OPTS        JVM heap flags (default -Xms256m -Xmx1g)
#   KAFKA_JVM_OPTS         more JVM flags (default none)
#   KAFKA_HOST             address listened on and advertised (default 127.0.0.1)
#   KAFKA_NODE_ID          node.id (default 1)
#   KAFKA_QUORUM_VOTERS    controller.quorum.voters (default 1@KAFKA_HOST:KAFKA_CONTROLLER_PORT)
#   KAFKA_CLUSTER_ID       cluster id to format with, the same on every node of a cluster
#                          (default: one of the state dir's own)
#   KAFKA_REPLICATION      default.replication.factor and the internal topics' (default 1)
#   KAFKA_MIN_ISR          min.insync.replicas and the internal topics' min ISR (default 1)
#   KAFKA_RACK             broker.rack; consumers with client.rack then fetch from the
#                          closest replica (default unset)
#   JAVA_HOME              Java 17+ to use (default: java on PATH)
#
# up and down are idempotent; concurrent calls on one state dir serialise on a
# lock file.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=kafka
# shellcheck source=../daemon.sh
. "$here/../daemon.sh"
pom=$here/pom.xml
version=${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")}
cache=${CAREHUB_CACHE_DIR:-$HOME/.cache/carehub}/kafka
libs=$cache/$version/libs
engine=$libs what="kafka $version"
port=${KAFKA_PORT:-$port_base}
cport=${KAFKA_CONTROLLER_PORT:-$((port + 1))}
host=${KAFKA_HOST:-127.0.0.1}
node_id=${KAFKA_NODE_ID:-1}
voters=${KAFKA_QUORUM_VOTERS:-1@$host:$cport}
replication=${KAFKA_REPLICATION:-1}
min_isr=${KAFKA_MIN_ISR:-1}
rack=${KAFKA_RACK:-}
state=${KAFKA_STATE_DIR:-$checkout/.local/kafka-$port}
start_timeout=${KAFKA_START_TIMEOUT:-60}
stop_timeout=${KAFKA_STOP_TIMEOUT:-30}
heap=${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}
jvm_opts=${KAFKA_JVM_OPTS:-}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java

props=$state/server.properties
logfile=$state/kafka.log
pidfile=$state/kafka.pid
where=$host:$port ports=("$port" "$cport") port_vars=(KAFKA_PORT KAFKA_CONTROLLER_PORT)
mark=$props logs="log: $logfile"
starting() { alive "$1"; }

fetch() { fetch_engine; }

download() {
	local tmp=$1
	command -v mvn >/dev/null || { rm -rf "$tmp"; die "mvn not found: install Maven (apt-get install maven)"; }
	# sed: Maven 3.8 prints colour resets even in batch mode.
	if ! mvn -q -B -f "$pom" -Dkafka.version="$version" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/out" 2>&1 |
		sed 's/\x1b\[[0-9;]*m//g' >&2; then
		rm -rf "$tmp"
		die "maven could not fetch kafka $version"
	fi
	[[ -f $tmp/out/kafka_2.13-$version.jar ]] || { rm -rf "$tmp"; die "kafka_2.13-$version.jar missing after fetch"; }
}

check_java() {
	command -v "$java" >/dev/null || die "java not found: Kafka $version needs Java 17+ (set JAVA_HOME)"
	local v major
	v=$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -1)
	major=${v%%.*}
	[[ $major =~ ^[0-9]+$ ]] && ((major >= 17)) || die "java $v found: Kafka $version needs Java 17+ (set JAVA_HOME)"
}

# live_brokers sends a Metadata v4 request (no topics) and prints the node ids of
# the live brokers in the answer, one a line: registered and unfenced. Kafka 4
# removed Metadata v0-v3.
live_brokers() {
	local out
	# shellcheck disable=SC2016 # expanded by the inner bash
	out=$(timeout 3 bash -c '
		exec 3<>"/dev/tcp/$1/$2" || exit 1
		# size 23 | api_key 3 | version 4 | correlation 7 | client_id "kafka.sh" | topics [] | allow_auto_topic_creation false
		printf "\x00\x00\x00\x17\x00\x03\x00\x04\x00\x00\x00\x07\x00\x08kafka.sh\x00\x00\x00\x00\x00" >&3
		# dd reads the size byte by byte: head would swallow the body with it.
		size=$(dd bs=1 count=4 <&3 2>/dev/null | od -An -tu4 --endian=big) || exit 1
		((size > 12 && size < 1 << 20)) || exit 1
		head -c "$size" <&3 | od -An -tu1 -v
	' probe "$host" "$port" 2>/dev/null) || return 1
	local -a b
	read -r -d '' -a b <<<"$out" || true
	# correlation | throttle_time_ms | brokers [node_id | host | port | rack]
	((${#b[@]} >= 12)) && [[ "${b[*]:0:4}" == "0 0 0 7" ]] || return 1
	local n i=12 len
	n=$((b[8] << 24 | b[9] << 16 | b[10] << 8 | b[11]))
	for ((; n > 0; n--)); do
		((i + 6 <= ${#b[@]})) || return 1
		echo $((b[i] << 24 | b[i + 1] << 16 | b[i + 2] << 8 | b[i + 3]))
		len=$((b[i + 4] << 8 | b[i + 5]))
		i=$((i + 6 + len + 4))
		len=$((b[i] << 8 | b[i + 1]))
		# A null rack has length -1.
		((len == 0xffff)) && len=0
		i=$((i + 2 + len))
	done
}

# probe succeeds when this node answers metadata and lists itself among the live
# brokers: it is registered, unfenced and serving clients.
probe() {
	local ids
	ids=$(live_brokers) || return 1
	grep -qx "$node_id" <<<"$ids"
}

write_config() {
	mkdir -p "$state/data"
	cat >"$props" <<EOF
# Written by kafka.sh up; edits are overwritten.
process.roles=broker,controller
node.id=$node_id
controller.quorum.voters=$voters
listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$cport
advertised.listeners=PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$state/data
num.partitions=1
default.replication.factor=$replication
min.insync.replicas=$min_isr
auto.create.topics.enable=false
offsets.topic.replication.factor=$replication
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$replication
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
# The session decides how soon a broker killed with -9 is fenced: in a cluster
# its partitions get new leaders and its replica leaves the ISR after about 2 s
# instead of 9. A restarted node is refused until its dead incarnation's session
# expires, so a short one also makes restart --signal KILL quick.
broker.session.timeout.ms=2000
broker.heartbeat.interval.ms=500
# On SIGTERM a node of a cluster hands its leaderships to the others first, so
# clients see no partition without a leader; a single node has none to hand over.
controlled.shutdown.enable=true
EOF
	if [[ -n $rack ]]; then
		# Consumers that name their client.rack fetch from a replica in it.
		printf '%s\n' "broker.rack=$rack" \
			"replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector" >>"$props"
	fi
	cat >"$state/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

# format_once formats KRaft storage on the first up of a state dir only;
# later ups (restart after a crash included) reuse the same storage.
format_once() {
	[[ -f $state/data/meta.properties ]] && return
	local cid
	if [[ -n ${KAFKA_CLUSTER_ID:-} ]]; then
		echo -n "$KAFKA_CLUSTER_ID" >"$state/cluster.id"
	elif [[ ! -s $state/cluster.id ]]; then
		# A Kafka Uuid: 16 random bytes, base64url without padding; like Kafka's own, never
		# one starting with "-", which the format command would read as an option.
		cid=-
		while [[ $cid == -* ]]; do
			cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
		done
		echo -n "$cid" >"$state/cluster.id"
	fi
	cid=$(<"$state/cluster.id")
	say "formatting storage in $state/data (cluster $cid)"
	"$java" -Xmx256m -Dlog4j2.configurationFile="$state/log4j2.properties" -cp "$libs/*" \
		kafka.tools.StorageTool format -t "$cid" -c "$props" --ignore-formatted >>"$logfile" 2>&1 8>&- 9>&- ||
		die "format failed; see $logfile"
}

running_version() {
	local from=${1:-0}
	tail -c +$((from + 1)) "$logfile" 2>/dev/null | sed -n 's/.*Kafka version: \([^ ]*\).*/\1/p' | tail -1
}

prepare() {
	[[ -f $libs/.complete ]] || fetch
	check_java
}

launch() {
	write_config
	format_once
	echo "=== kafka.sh up $(date -Is) ===" >>"$logfile"
	# setsid: the broker must not die with the shell or make recipe that
	# started it; down is the way to stop it. It must not inherit the lock
	# fds either, or it would hold the lock for its whole life.
	# shellcheck disable=SC2086
	setsid "$java" $heap $jvm_opts -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$state/log4j2.properties" \
		-cp "$libs/*" kafka.Kafka "$props" >>"$logfile" 2>&1 </dev/null 8>&- 9>&- &
}

show_version() {
	local v
	if running_pid >/dev/null && v=$(running_version) && [[ -n $v ]]; then
		echo "$v"
	else
		echo "$version"
	fi
}

cmd_brokers() { echo "$host:$port"; }

# cmd_live prints the node ids of the live brokers this node reports; cluster.sh
# waits on it for the whole cluster.
cmd_live() { live_brokers || die "no metadata from $where"; }

# cmd_kill: a crash, for the fault tests; down is the clean stop.
cmd_kill() {
	lock
	stop KILL
}

cmd_pid() { running_pid || exit 3; }

# cmd_prepare: what up needs first (the jars, Java), so cluster.sh fails once, not once a node.
cmd_prepare() { prepare; }

main "$@"
