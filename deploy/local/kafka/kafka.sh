#!/usr/bin/env bash
# kafka.sh runs a single-node Apache Kafka (KRaft, combined broker and
# controller) on 127.0.0.1 for carehub's tests and local runs.
#
#   kafka.sh fetch                           jars into the cache (Maven), once
#   kafka.sh up                              format once, start, wait until it answers metadata
#   kafka.sh down                            SIGTERM (controlled shutdown), SIGKILL after a timeout
#   kafka.sh restart [--signal TERM|KILL]    stop with that signal, start on the same storage
#   kafka.sh status                          exit 0 up, 1 running but not answering, 3 down
#   kafka.sh version                         the version fetched/started
#   kafka.sh brokers                         the --kafka-brokers of this broker
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
state=${KAFKA_STATE_DIR:-$checkout/.local/kafka-$port}
start_timeout=${KAFKA_START_TIMEOUT:-60}
stop_timeout=${KAFKA_STOP_TIMEOUT:-30}
heap=${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java

props=$state/server.properties
logfile=$state/kafka.log
pidfile=$state/kafka.pid
where=127.0.0.1:$port ports=("$port" "$cport") port_vars=(KAFKA_PORT KAFKA_CONTROLLER_PORT)
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

# probe sends a Metadata v4 request (no topics) and succeeds when the answer
# carries our correlation id and at least one live broker: the broker is
# registered, unfenced and serving clients. Kafka 4 removed Metadata v0-v3.
probe() {
	local out
	out=$(timeout 3 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		# size 23 | api_key 3 | version 4 | correlation 7 | client_id "kafka.sh" | topics [] | allow_auto_topic_creation false
		printf "\x00\x00\x00\x17\x00\x03\x00\x04\x00\x00\x00\x07\x00\x08kafka.sh\x00\x00\x00\x00\x00" >&3
		# size | correlation | throttle_time_ms | broker count
		head -c 16 <&3 | od -An -tu1 -v
	' probe "$port" 2>/dev/null) || return 1
	# shellcheck disable=SC2086
	set -- $out
	(($# == 16)) || return 1
	[[ "$5 $6 $7 $8" == "0 0 0 7" ]] || return 1
	(((${13} << 24 | ${14} << 16 | ${15} << 8 | ${16}) >= 1))
}

write_config() {
	mkdir -p "$state/data"
	cat >"$props" <<EOF
# Written by kafka.sh up; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$state/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# After a kill -9 the restarted controller keeps the dead incarnation's
# registration until its session expires (default 9 s) and rejects the new one
# meanwhile; a short session makes restart --signal KILL quick.
broker.session.timeout.ms=2000
broker.heartbeat.interval.ms=500
# One node: nothing to hand leadership to, so controlled shutdown is quick.
controlled.shutdown.enable=true
EOF
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
	if [[ ! -s $state/cluster.id ]]; then
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
	setsid "$java" $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
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

cmd_brokers() { echo "127.0.0.1:$port"; }

main "$@"
