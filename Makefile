# velocity-consumer: the commands the README names. `make test` is what CI runs.
#
#   make demo               the whole pipeline on an in-process broker, one command
#   make test               unit tests (-race), then integration tests on a real Kafka broker
#   make test-unit          unit tests only; no broker needed (python3 with pyarrow is: see below)
#   make test-integration   start a real broker (scripts/kafka-local.sh), run integration/, stop it
#                           (integration/secure also starts a private SASL_SSL broker of its own
#                           through the same script, and an in-process schema registry: no extra setup)
#   make check              gofmt and go vet, integration tests included
#   make docs               regenerate docs/flags.md from the flag definitions
#   make kafka-start | kafka-stop | kafka-status   a broker on 127.0.0.1:9092 for development
#   make bench-peers        ours against Kafka Streams and the seed Python library (BENCHMARKS.md)
#   make bench-floor        ours against the transport floor, profiled, with the CPU account by stage
#   make bench-api          the query API under lookup load while ingesting at half of peak
#   make chaos              the randomized fault checker's long schedules (docs/fault-checker.md);
#                           its short schedule runs inside test-integration
#
# Every run lists the tests that skipped, with their reasons (scripts/skipped-tests.sh),
# so a skip is never mistaken for a pass. Two unit tests use Python as an independent
# check: the oracle (python3, standard library) and the Parquet reader (pyarrow).
# VELOCITY_REQUIRE_PYTHON=1, the default here, makes them fail rather than skip when
# those are missing; `make test VELOCITY_REQUIRE_PYTHON=0` lets them skip.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

GO ?= go
# Generous but finite: a hung test fails the run instead of holding CI.
UNIT_TIMEOUT ?= 15m
# Per package: integration/recovery runs about 7 minutes on a quiet 2-core machine,
# and CI's load can double that.
INTEGRATION_TIMEOUT ?= 30m
# Extra flags for go test, e.g. GOTESTFLAGS='-run TestKcat'.
GOTESTFLAGS ?=
VELOCITY_REQUIRE_PYTHON ?= 1
export VELOCITY_REQUIRE_PYTHON

.PHONY: demo test test-unit test-integration check docs kafka-start kafka-stop kafka-status bench-peers bench-groups bench-floor bench-api chaos

demo:
	$(GO) run ./cmd/velocity-consumer demo

test: test-unit test-integration

# -v so that skips can be listed; only the package lines are shown while it runs, then
# the skipped tests, then (on failure) what each failing test printed.
test-unit:
	@log="$$(mktemp -t velocity-unit.XXXXXX)"; trap 'rm -f "$$log"' EXIT; \
	echo "make: unit tests (go test -race -v; VELOCITY_REQUIRE_PYTHON=$$VELOCITY_REQUIRE_PYTHON)"; \
	set +e; \
	$(GO) test -race -v -timeout $(UNIT_TIMEOUT) $(GOTESTFLAGS) ./... 2>&1 | tee "$$log" | \
		grep --line-buffered -E '^(ok|FAIL|\?|panic:|fatal error:|WARNING: DATA RACE|testing: race detected outside)|^--- FAIL'; \
	rc=$${PIPESTATUS[0]}; set -e; \
	scripts/skipped-tests.sh "$$log"; \
	if [[ $$rc -ne 0 ]]; then scripts/failed-tests.sh "$$log" || true; fi; \
	exit $$rc

# The broker gets a free port and a state directory of its own, so that this target can
# run while a development broker (or another checkout's `make test`) is up. The trap stops
# the broker and removes its state however the tests end. The ports are below the
# kernel's ephemeral range (32768 and up on Linux): a port of that range can be the local
# end of any client's outgoing connection, which a connect test does not see and the
# broker's bind then fails on (a controller port taken so, on a machine busy with other
# Kafka clients, stopped a run before its first test).
test-integration:
	state="$$(mktemp -d -t velocity-kafka.XXXXXX)"; \
	port=""; \
	for _ in $$(seq 50); do \
		p=$$((20000 + RANDOM % 12000)); \
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$$p") 2>/dev/null && \
		   ! (exec 3<>"/dev/tcp/127.0.0.1/$$((p + 1)))") 2>/dev/null; then port=$$p; break; fi; \
	done; \
	[[ -n "$$port" ]] || { echo "make: no free port pair found for the test broker" >&2; exit 1; }; \
	export KAFKA_PORT=$$port KAFKA_LOCAL_STATE="$$state"; \
	trap 'scripts/kafka-local.sh stop || true; rm -rf "$$state"' EXIT; \
	t0=$$SECONDS; \
	brokers="$$(scripts/kafka-local.sh start)"; \
	echo "make: started a real Apache Kafka broker at $$brokers in $$((SECONDS - t0))s (scripts/kafka-local.sh)"; \
	echo "make: integration tests run against the real Kafka broker at $$brokers (VELOCITY_REQUIRE_KAFKA=1: none may skip for want of it)"; \
	log="$$state/go-test.log"; \
	KAFKA_BROKERS="$$brokers" VELOCITY_REQUIRE_KAFKA=1 \
		$(GO) test -tags integration -count=1 -v -timeout $(INTEGRATION_TIMEOUT) $(GOTESTFLAGS) ./integration/... 2>&1 | tee "$$log" || { \
		rc=$$?; scripts/skipped-tests.sh "$$log"; scripts/failed-tests.sh "$$log" || true; exit $$rc; }; \
	scripts/skipped-tests.sh "$$log"

check:
	@unformatted="$$(gofmt -l .)"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags integration ./integration/...

docs:
	$(GO) generate ./cmd/velocity-consumer

kafka-start:
	scripts/kafka-local.sh start

kafka-stop:
	scripts/kafka-local.sh stop

kafka-status:
	scripts/kafka-local.sh status

# The end-to-end comparison of BENCHMARKS.md: ours against a Kafka Streams processor and
# the seed Python library on one workload. Needs the broker of `make kafka-start` on
# 127.0.0.1:9092, Java 17 + Maven (the Kafka Streams peer) and python3.
# Takes about half an hour per 3 rounds; results and processor logs go to BENCH_DIR.
BENCH_ROUNDS ?= 3
BENCH_DIR ?= bin/bench
bench-peers:
	mkdir -p $(BENCH_DIR)
	$(GO) build -o bin/velocity-consumer ./cmd/velocity-consumer
	$(GO) build -o bin/velocity-bench ./cmd/velocity-bench
	cd bench/kstreams && mvn -q -B package
	bin/velocity-bench compare --rounds $(BENCH_ROUNDS) --vc bin/velocity-consumer --workdir $(BENCH_DIR) \
		--processors 'ours,ours:late=2s,ours:eos,kstreams,kstreams:eos' \
		--latency-processors 'ours,kstreams,kstreams:eos' --latency-rate 20000
	bin/velocity-bench seq --out $(BENCH_DIR)/seq-100k.bin --entities 100000 --events 1000000
	python3 bench/python/seed_window.py $(BENCH_DIR)/seq-100k.bin --passes 5
	VELOCITY_BENCH_SEQ=$(BENCH_DIR)/seq-100k.bin $(GO) test -run '^$$' -bench SeedSequence -count 5 ./cmd/velocity-bench/

# BENCHMARKS.md, "Re-keyed groups": ours with 1, 2 and 3 groups against the Kafka Streams
# peer re-keying with selectKey + repartition, on the payments workload; needs the broker
# of `make kafka-start` (or BENCH_BROKERS), Java 17 + Maven.
bench-groups:
	mkdir -p $(BENCH_DIR)-groups
	$(GO) build -o bin/velocity-consumer ./cmd/velocity-consumer
	$(GO) build -o bin/velocity-bench ./cmd/velocity-bench
	cd bench/kstreams && mvn -q -B package
	bin/velocity-bench compare --brokers $(BENCH_BROKERS) --vc bin/velocity-consumer --rounds $(BENCH_ROUNDS) \
		--events 1000000 --entities 100000 --workload payments --latency-processors '' --workdir $(BENCH_DIR)-groups \
		--processors 'ours:groups=1,kstreams:groups=1,ours:groups=2,kstreams:groups=2,ours:groups=3,kstreams:groups=3'

# BENCHMARKS.md, "Against the transport floor" and "Where ours spends its CPU above the
# floor": floor, ours and ours --exactly-once in the same rounds on BENCH_BROKERS, each run
# profiled, then the CPU account by stage: per processor, the median over its runs (both
# entity counts).
bench-floor:
	$(GO) build -o bin/velocity-consumer ./cmd/velocity-consumer
	$(GO) build -o bin/velocity-bench ./cmd/velocity-bench
	rm -rf $(BENCH_DIR)-floor && mkdir -p $(BENCH_DIR)-floor
	bin/velocity-bench compare --brokers $(BENCH_BROKERS) --rounds $(BENCH_ROUNDS) --events 1000000 --entities 100000,1000000 \
		--processors floor,ours,ours:eos --latency-processors '' --vc bin/velocity-consumer --workdir $(BENCH_DIR)-floor --profile
	d=$(BENCH_DIR)-floor; runs() { ls $$d/vb-*-"$$1"/cpu.pprof | paste -sd, -; }; \
	bin/velocity-bench stages --names floor,ours,ours:eos "$$(runs floor)" "$$(runs ours)" "$$(runs ours-eos)"

# BENCHMARKS.md, "Query API": needs the broker of `make kafka-start` (or
# BENCH_BROKERS). Peak run, then half of it paced, without and with 20 000 lookups/s.
BENCH_BROKERS ?= 127.0.0.1:9092
bench-api:
	$(GO) build -o bin/velocity-consumer ./cmd/velocity-consumer
	$(GO) build -o bin/velocity-bench ./cmd/velocity-bench
	bin/velocity-bench api --brokers $(BENCH_BROKERS) --vc bin/velocity-consumer --workdir bin/bench-api

# The randomized fault checker's long schedules (docs/fault-checker.md). Each
# store (kafka, file) runs CHAOS_RUNS random seeds, or the seeds in CHAOS_SEEDS
# (comma-separated): a schedule of about CHAOS_DURATION plus a minute or two of final
# checks, against a default-mode and an --exactly-once group at once. It starts a private broker of its own, and a
# three-node cluster for kafka-cluster (Java 17 + Maven).
# Logs of every run are kept under CHAOS_LOGS; one line per run is appended to CHAOS_REPORT.
CHAOS_DURATION ?= 10m
CHAOS_RUNS ?= 1
CHAOS_SEEDS ?=
CHAOS_LOGS ?= bin/chaos
CHAOS_REPORT ?= $(CHAOS_LOGS)/report.tsv
CHAOS_TIMEOUT ?= 6h
# One variant only: CHAOS_STORES=kafka (the three kafka runs), kafka-groups, kafka-cluster, file (both file runs) or file-features
CHAOS_STORES ?=
chaos:
	mkdir -p $(CHAOS_LOGS)
	VELOCITY_REQUIRE_KAFKA=1 VELOCITY_CHAOS_DURATION=$(CHAOS_DURATION) VELOCITY_CHAOS_RUNS=$(CHAOS_RUNS) \
		VELOCITY_CHAOS_SEED=$(CHAOS_SEEDS) VELOCITY_CHAOS_LOGS=$(abspath $(CHAOS_LOGS)) \
		VELOCITY_CHAOS_REPORT=$(abspath $(CHAOS_REPORT)) \
		$(GO) test -tags integration -count=1 -v -timeout $(CHAOS_TIMEOUT) -run 'TestChaos$$/$(CHAOS_STORES)' $(GOTESTFLAGS) ./integration/chaos/
