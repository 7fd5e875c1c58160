#!/usr/bin/env bash
# kafka-local.sh: a real single-node Apache Kafka 4.x broker for tests, without Docker.
#
#   scripts/kafka-local.sh start    fetch the jars (first time), format, start, wait until ready
#   scripts/kafka-local.sh stop     SIGTERM, wait, then SIGKILL
#   scripts/kafka-local.sh status   exit 0 and print the address if running, exit 3 if not
#   scripts/kafka-local.sh restart  start again on the data a stopped or killed broker left
#                                   (what a broker restart is in production; no format)
#
# The broker's classpath comes from Maven (scripts/kafka-local/pom.xml: org.apache.kafka:
# kafka_2.13 plus an SLF4J->log4j2 binding) and is cached outside the repo, so a second
# start needs no network and takes seconds. The broker is a combined KRaft
# broker+controller on 127.0.0.1 (PLAINTEXT), with settings for tests: replication factor 1
# for every internal topic (KAFKA_REPLICATION for a cluster), transactions on one node, no
# initial rebalance delay, a small heap. Every start formats a fresh, empty log dir
# (restart keeps it). On success the last line on stdout is the bootstrap address
# (127.0.0.1:PORT); on failure the broker's last log lines are printed and the exit
# status is non-zero.
#
# Environment (defaults in brackets):
#   KAFKA_PORT              client listener port [9092]
#   KAFKA_CONTROLLER_PORT   KRaft controller port [KAFKA_PORT+1]
#   KAFKA_LOCAL_CACHE       root of the cache [${XDG_CACHE_HOME:-~/.cache}/velocity-consumer]
#                           jars: $KAFKA_LOCAL_CACHE/kafka-<version>/libs
#                           state: $KAFKA_LOCAL_CACHE/kafka-<version>/run-<port>
#   KAFKA_LOCAL_STATE       state directory (config, data, logs, PID file) instead of the above
#   KAFKA_START_TIMEOUT     seconds to wait for the broker to accept connections [120]
#   KAFKA_STOP_TIMEOUT      seconds to wait after SIGTERM before SIGKILL [30]
#   KAFKA_HEAP_OPTS         JVM heap and GC flags [-Xms64m -Xmx512m -XX:+UseSerialGC]
#   KAFKA_LOCAL_OWNER_PID   if set, the broker is killed when this process ends
#   KAFKA_EXTRA_PROPERTIES  a file appended to server.properties; a key it repeats wins
#                           (e.g. a SASL_SSL listener beside PLAINTEXT; see integration/kafkatest)
#   KAFKA_SCRAM_CREDENTIALS SCRAM users created at format time, one per line, as the storage
#                           tool's --add-scram takes them: SCRAM-SHA-512=[name=alice,password=...]
#
# One node of a cluster of several (each node is its own invocation, with its own ports
# and state directory; start them together, since none serves before a quorum of the
# controllers is up):
#   KAFKA_NODE_ID           this node's id [1]
#   KAFKA_QUORUM_VOTERS     every controller, id@host:port,... [1@127.0.0.1:KAFKA_CONTROLLER_PORT]
#   KAFKA_CLUSTER_ID        the cluster id every node is formatted with [a new random one]
#   KAFKA_REPLICATION       replication factor of new and internal topics [1]; above 1,
#                           min.insync.replicas is 2, as in production
#   JAVA, MVN               the java and mvn commands [java, mvn]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/kafka-local/pom.xml"
log4j_conf="$here/kafka-local/log4j2.xml"

JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
port="${KAFKA_PORT:-9092}"
cport="${KAFKA_CONTROLLER_PORT:-$((port + 1))}"
node_id="${KAFKA_NODE_ID:-1}"
voters="${KAFKA_QUORUM_VOTERS:-$node_id@127.0.0.1:$cport}"
replication="${KAFKA_REPLICATION:-1}"
[[ "$node_id" =~ ^[0-9]+$ ]] || { echo "kafka-local: error: KAFKA_NODE_ID=$node_id is not a number" >&2; exit 2; }
[[ "$replication" =~ ^[1-9][0-9]*$ ]] || { echo "kafka-local: error: KAFKA_REPLICATION=$replication is not a positive number" >&2; exit 2; }
min_isr=1
((replication > 1)) && min_isr=2
start_timeout="${KAFKA_START_TIMEOUT:-120}"
stop_timeout="${KAFKA_STOP_TIMEOUT:-30}"
heap_opts="${KAFKA_HEAP_OPTS:--Xms64m -Xmx512m -XX:+UseSerialGC}"

# The version is the pom's, so the pom is the one place to change it.
version="$(sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$pom")"
cache_root="${KAFKA_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/velocity-consumer}"
home="$cache_root/kafka-$version"
libs="$home/libs"
run="${KAFKA_LOCAL_STATE:-$home/run-$port}"
pidfile="$run/kafka.pid"
logdir="$run/logs"

say() { echo "kafka-local: $*" >&2; }
die() { say "error: $*"; exit 1; }

# running prints the PID of this port's broker if it is alive and is really our java
# process (the PID file may be stale and the PID reused).
running() {
	[[ -f "$pidfile" ]] || return 1
	local pid
	pid="$(cat "$pidfile" 2>/dev/null)" || return 1
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$run/server.properties" || return 1
	echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

show_logs() {
	local f
	for f in "$logdir/server.log" "$logdir/stdout.log"; do
		[[ -s "$f" ]] || continue
		say "last lines of $f:"
		tail -n "${1:-40}" "$f" >&2
	done
}

require_java() {
	command -v "$JAVA" >/dev/null || die "java not found (need Java 17+); set JAVA or install a JDK"
	local v
	v="$("$JAVA" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
	[[ "${v%%.*}" =~ ^[0-9]+$ && "${v%%.*}" -ge 17 ]] || die "Kafka $version needs Java 17+, $JAVA is ${v:-unknown}"
}

# fetch copies kafka_2.13 and its runtime dependencies into $libs unless the cache already
# holds them for this exact pom.
fetch() {
	local sum
	sum="$(sha256sum "$pom" | cut -d' ' -f1)"
	if [[ -f "$libs/.pom.sha256" && "$(cat "$libs/.pom.sha256")" == "$sum" ]]; then
		return 0
	fi
	command -v "$MVN" >/dev/null || die "mvn not found: needed once to fetch Kafka $version's jars into $libs"
	say "fetching Kafka $version jars with Maven into $libs (first start only)"
	local tmp="$home/libs.tmp.$$"
	rm -rf "$tmp"
	mkdir -p "$home"
	if ! "$MVN" -B -q -f "$pom" \
		org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" >"$home/mvn.log" 2>&1; then
		tail -n 40 "$home/mvn.log" >&2
		rm -rf "$tmp"
		die "Maven could not fetch Kafka $version (log: $home/mvn.log)"
	fi
	ls "$tmp"/kafka_2.13-"$version".jar >/dev/null 2>&1 || die "Maven ran but $tmp has no kafka_2.13-$version.jar"
	echo "$sum" >"$tmp/.pom.sha256"
	rm -rf "$libs"
	mv "$tmp" "$libs"
}

write_config() {
	mkdir -p "$run/data" "$logdir" "$run/tmp"
	cat >"$run/server.properties" <<EOF
# Written by scripts/kafka-local.sh; rewritten on every start.
process.roles=broker,controller
node.id=$node_id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$run/data

# Every internal topic has KAFKA_REPLICATION replicas (one on a single node, where a
# min ISR above 1 could never be met), and one partition where that makes the first
# group or transaction call cheap.
default.replication.factor=$replication
min.insync.replicas=$min_isr
num.partitions=1
offsets.topic.replication.factor=$replication
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$replication
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=$replication
share.coordinator.state.topic.min.isr=$min_isr
share.coordinator.state.topic.num.partitions=1

# Tests: no wait before the first rebalance; compaction observable within seconds.
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=1000
# The cleaner allocates this on heap at start (128 MiB by default); it must stay > 1 MiB.
log.cleaner.dedupe.buffer.size=4194304
# Test streams carry fixed event times, weeks behind the wall clock by now, as their
# records' timestamps: the default 7-day retention would delete them at its next check
# (every 5 min), in the middle of a test. Keep every record; tests delete with DeleteRecords.
log.retention.ms=-1
# Kafka 4 rejects timestamps more than 1 h ahead; synthetic test streams run ahead of the
# wall clock, so allow 100 years.
log.message.timestamp.after.max.ms=3153600000000
# Kafka's production default, stated so that size limits behave as they do in production.
message.max.bytes=1048588
num.network.threads=2
num.io.threads=4
EOF
	if [[ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]]; then
		[[ -f "$KAFKA_EXTRA_PROPERTIES" ]] || die "KAFKA_EXTRA_PROPERTIES: no file $KAFKA_EXTRA_PROPERTIES"
		{ echo; echo "# From $KAFKA_EXTRA_PROPERTIES (KAFKA_EXTRA_PROPERTIES)."; cat "$KAFKA_EXTRA_PROPERTIES"; } >>"$run/server.properties"
	fi
}

start() {
	local pid keep="${1:-}"
	if pid="$(running)"; then
		say "already running (pid $pid) at 127.0.0.1:$port"
		echo "127.0.0.1:$port"
		return 0
	fi
	require_java
	[[ -f "$log4j_conf" ]] || die "missing $log4j_conf"
	if port_open "$port"; then
		die "127.0.0.1:$port is in use by another process; set KAFKA_PORT to a free port"
	fi
	if port_open "$cport"; then
		die "127.0.0.1:$cport (controller) is in use by another process; set KAFKA_CONTROLLER_PORT"
	fi
	fetch

	local t0=$SECONDS
	if [[ -n "$keep" ]]; then
		[[ -f "$run/data/meta.properties" ]] || die "restart: no formatted data in $run/data to start on"
		rm -rf "$run/tmp" "$run/server.properties" "$pidfile"
	else
		rm -rf "$run/data" "$logdir" "$run/tmp" "$run/server.properties" "$pidfile"
	fi
	write_config
	local cp="$libs/*"
	local jvm=(-Djava.io.tmpdir="$run/tmp" -Dkafka.logs.dir="$logdir"
		-Dlog4j2.configurationFile="$log4j_conf" -Djava.awt.headless=true)

	# A Kafka cluster id is 16 random bytes, URL-safe base64 without padding; one that
	# begins with '-' would be read as an option by the storage tool, so draw again.
	local cluster_id="${KAFKA_CLUSTER_ID:-}"
	[[ "$cluster_id" != -* ]] || die "KAFKA_CLUSTER_ID=$cluster_id: the storage tool would read it as an option"
	while [[ -z "$cluster_id" || "$cluster_id" == -* ]]; do
		cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
	done
	local scram=() line
	while IFS= read -r line; do
		if [[ -n "$line" ]]; then scram+=(--add-scram "$line"); fi
	done <<<"${KAFKA_SCRAM_CREDENTIALS:-}"
	if [[ -z "$keep" ]] && ! "$JAVA" -Xmx256m -XX:+UseSerialGC "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool \
		format -t "$cluster_id" -c "$run/server.properties" "${scram[@]}" >"$logdir/format.log" 2>&1; then
		cat "$logdir/format.log" >&2
		die "formatting $run/data failed"
	fi

	# setsid: the broker outlives the shell (or test binary) that started it, and a Ctrl-C
	# in that terminal does not reach it; `stop` ends it.
	# shellcheck disable=SC2086 # heap_opts is a list of flags
	setsid "$JAVA" $heap_opts -XX:+ExitOnOutOfMemoryError "${jvm[@]}" -cp "$cp" kafka.Kafka \
		"$run/server.properties" >"$logdir/stdout.log" 2>&1 </dev/null 9>&- &
	pid=$!
	echo "$pid" >"$pidfile"
	if [[ -n "${KAFKA_LOCAL_OWNER_PID:-}" ]]; then
		# A watchdog: the broker dies with its owner (e.g. a test binary ended by a
		# timeout before its cleanup ran). SIGKILL also ends a broker a test froze.
		setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
			kill -KILL "$2" 2>/dev/null' watchdog "$KAFKA_LOCAL_OWNER_PID" "$pid" \
			</dev/null >/dev/null 2>&1 9>&- &
	fi

	# The broker binds its client port only once it can serve requests, so an open port
	# is the ready signal; a dead PID ends the wait at once.
	local deadline=$((SECONDS + start_timeout))
	until port_open "$port"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			show_logs 60
			rm -f "$pidfile"
			die "broker exited during start-up (logs: $logdir)"
		fi
		if ((SECONDS >= deadline)); then
			show_logs 60
			kill -KILL "$pid" 2>/dev/null || true
			rm -f "$pidfile"
			die "broker did not accept connections on 127.0.0.1:$port within ${start_timeout}s"
		fi
		sleep 0.2
	done
	say "Kafka $version ready at 127.0.0.1:$port (pid $pid, $((SECONDS - t0))s; logs: $logdir)"
	echo "127.0.0.1:$port"
}

stop() {
	local pid
	if ! pid="$(running)"; then
		say "not running (port $port)"
		rm -f "$pidfile"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + stop_timeout))
	while kill -0 "$pid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			say "no exit ${stop_timeout}s after SIGTERM; sending SIGKILL to $pid"
			kill -KILL "$pid" 2>/dev/null || true
			break
		fi
		sleep 0.2
	done
	rm -f "$pidfile"
	say "stopped (pid $pid)"
}

status() {
	local pid
	if pid="$(running)"; then
		if port_open "$port"; then
			say "running (pid $pid), Kafka $version"
		else
			say "process $pid alive but 127.0.0.1:$port does not accept connections"
			return 1
		fi
		echo "127.0.0.1:$port"
		return 0
	fi
	say "not running (port $port)"
	return 3
}

cmd="${1:-}"
case "$cmd" in
start | stop | status) ;;
restart) cmd="start keep" ;;
*)
	echo "usage: $0 start|stop|status|restart" >&2
	exit 2
	;;
esac

# One start or stop at a time per port: engineers and test binaries share the cache.
mkdir -p "$home"
exec 9>"$home/lock-$port"
flock -w $((start_timeout + stop_timeout + 600)) 9 || die "timed out waiting for $home/lock-$port"
$cmd
