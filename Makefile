# carehub: `make run` starts a node on the embedded defaults with demo data; `make test` runs the
# whole suite; `make run-engines` runs the node on this checkout's own Kafka and ClickHouse.
# `make help` lists every target.

SHELL        := /bin/bash
GO           ?= go
BIN          := bin/carehub
VERSION      ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# The git commit, stamped into the binary (carehub_build_info{revision}) by -ldflags: Go's own VCS
# stamp is off under GOFLAGS=-buildvcs=false and without git. Empty outside a checkout.
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null)
DATA_DIR     ?= /tmp/carehub
HTTP_ADDR    ?= 127.0.0.1:8080
# make run on engines outside the node, each in place of its embedded default: KAFKA (host:port,
# comma-separated), CLICKHOUSE (clickhouse://host:port/database, for the event and audit log),
# DATABASE_URL (postgres://…).
KAFKA        ?=
CLICKHOUSE   ?=
DATABASE_URL ?=
RUN_FLAGS     = --data-dir $(DATA_DIR) --http-addr $(HTTP_ADDR) --webhooks-allow-private --demo-key --log-format text \
	$(if $(KAFKA),--kafka-brokers '$(KAFKA)') $(if $(CLICKHOUSE),--clickhouse-url '$(CLICKHOUSE)') \
	$(if $(DATABASE_URL),--database-url '$(DATABASE_URL)')
# The local engines (deploy/local): each checkout's own ports, state under its .local/ and
# ClickHouse database, chosen by the scripts from the checkout's path; KAFKA_PORT,
# CLICKHOUSE_TCP_PORT, CLICKHOUSE_HTTP_PORT, their *_STATE_DIR and CLICKHOUSE_DATABASE, given to
# make, reach the scripts.
KAFKA_SH      := deploy/local/kafka/kafka.sh
KAFKA_CLUSTER_SH := deploy/local/kafka/cluster.sh
CLICKHOUSE_SH := deploy/local/clickhouse/clickhouse.sh
# The whole suite runs under the race detector and in shuffled order: a test that depends on
# the order of tests or on a data race fails here, not at random later.
GOTESTFLAGS  ?= -count=1 -timeout 25m -race -shuffle=on
NODE_DIRS    := api/ws/nodetest api/graphql/explorer/web processors/webhooks/nodeverify tests/fhir-js
PYTHON       ?= python3
FUZZ_VENV    ?= $(HOME)/.cache/carehub/venv
FUZZ_REQS    := e2e/contracttest/requirements.txt

# The embedded ONNX Runtime's shared library (onnxruntime-deps), from the PyPI wheel.
include deploy/local/onnxruntime/onnxruntime.mk

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {n++; t[n] = $$1; d[n] = $$2; if (length($$1) > w) w = length($$1)} \
		END {for (i = 1; i <= n; i++) printf "  \033[36m%-" w "s\033[0m  %s\n", t[i], d[i]}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/carehub
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN) ./cmd/carehub

.PHONY: postgres-binaries
postgres-binaries: ## install PostgreSQL server binaries with apt-get when they are missing
	@deploy/local/ensure-postgres.sh

.PHONY: run
run: postgres-binaries onnxruntime-deps build ## start carehub with demo data, on the embedded defaults or on KAFKA, CLICKHOUSE, DATABASE_URL (DATA_DIR, HTTP_ADDR)
	$(BIN) serve $(strip $(RUN_FLAGS))

# The engines keep running when the node stops (Ctrl-C): the next run-engines finds them up, and
# engines-down stops them.
.PHONY: run-engines
run-engines: kafka-up clickhouse-up ## start this checkout's Apache Kafka and ClickHouse, then make run on them
	@echo "run-engines: KAFKA=$$($(KAFKA_SH) brokers) CLICKHOUSE=$$($(CLICKHOUSE_SH) url) (make engines-down stops them)"
	@$(MAKE) --no-print-directory run KAFKA=$$($(KAFKA_SH) brokers) CLICKHOUSE=$$($(CLICKHOUSE_SH) url)

.PHONY: engines-down
engines-down: kafka-down clickhouse-down ## stop this checkout's Apache Kafka and ClickHouse (their data stays)

.PHONY: node-deps
node-deps: ## install the npm packages the Node-based tests use (lockfiles committed)
	@for d in $(NODE_DIRS); do \
		if [ -f $$d/package-lock.json ] && [ ! -d $$d/node_modules ]; then (cd $$d && npm ci --no-audit --no-fund --loglevel=error) || exit 1; fi; \
	done

.PHONY: fuzz-deps
fuzz-deps: ## install Schemathesis, pinned in e2e/contracttest/requirements.txt, into FUZZ_VENV
	@if ! cmp -s $(FUZZ_REQS) $(FUZZ_VENV)/requirements.txt; then \
		$(PYTHON) -m venv $(FUZZ_VENV) && \
		$(FUZZ_VENV)/bin/pip install -q --disable-pip-version-check -r $(FUZZ_REQS) && \
		cp $(FUZZ_REQS) $(FUZZ_VENV)/requirements.txt; \
	fi

# The FHIR client suite's Maven repository (api/fhir TestHAPIClientRoundTrip reads the same
# default, or CAREHUB_M2_REPO): filled once from Maven Central, then the suite runs offline.
FHIR_CLIENT_POM := tests/fhir-client/pom.xml
CAREHUB_M2_REPO ?= $(HOME)/.cache/carehub/m2

.PHONY: fhir-client-deps
fhir-client-deps: ## fetch HAPI FHIR (client, R4 validator) for tests/fhir-client into CAREHUB_M2_REPO
	@if ! cmp -s $(FHIR_CLIENT_POM) $(CAREHUB_M2_REPO)/fhir-client.pom; then \
		mvn -B -q -Dmaven.repo.local=$(CAREHUB_M2_REPO) -f $(FHIR_CLIENT_POM) dependency:resolve dependency:resolve-plugins compile exec:help >/dev/null && \
		cp $(FHIR_CLIENT_POM) $(CAREHUB_M2_REPO)/fhir-client.pom; \
	fi

# The Python FHIR client suite (api/fhir TestPythonClients: fhirpy, fhirclient and fhir.resources
# R4 models, every package pinned in tests/fhir-py/requirements.txt) runs from its own virtualenv.
FHIR_PY_VENV ?= $(HOME)/.cache/carehub/fhir-py-venv
FHIR_PY_REQS := tests/fhir-py/requirements.txt

.PHONY: fhir-py-deps
fhir-py-deps: ## install the Python FHIR clients, pinned in tests/fhir-py/requirements.txt, into FHIR_PY_VENV
	@if ! cmp -s $(FHIR_PY_REQS) $(FHIR_PY_VENV)/requirements.txt; then \
		rm -rf $(FHIR_PY_VENV) && $(PYTHON) -m venv $(FHIR_PY_VENV) && \
		$(FHIR_PY_VENV)/bin/pip install -q --disable-pip-version-check -r $(FHIR_PY_REQS) && \
		cp $(FHIR_PY_REQS) $(FHIR_PY_VENV)/requirements.txt; \
	fi

# The Python webhook client (e2e/pyclient TestPythonAttemptLog: PyPI's standardwebhooks and
# requests, every package pinned in e2e/pyclient/requirements.txt) runs from its own virtualenv.
PYCLIENT_VENV ?= $(HOME)/.cache/carehub/pyclient-venv
PYCLIENT_REQS := e2e/pyclient/requirements.txt

.PHONY: pyclient-deps
pyclient-deps: ## install the Python webhook client's packages, pinned in e2e/pyclient/requirements.txt, into PYCLIENT_VENV
	@if ! cmp -s $(PYCLIENT_REQS) $(PYCLIENT_VENV)/requirements.txt; then \
		rm -rf $(PYCLIENT_VENV) && $(PYTHON) -m venv $(PYCLIENT_VENV) && \
		$(PYCLIENT_VENV)/bin/pip install -q --disable-pip-version-check -r $(PYCLIENT_REQS) && \
		cp $(PYCLIENT_REQS) $(PYCLIENT_VENV)/requirements.txt; \
	fi

# Synthea patients (api/fhir TestSyntheaTransactions): the generator from Maven Central
# (org.mitre.synthea:synthea, tests/synthea/pom.xml) into CAREHUB_M2_REPO, its patients made once
# with a fixed seed into SYNTHEA_DIR; made again only when the pom or the script change.
SYNTHEA_DIR  ?= $(HOME)/.cache/carehub/synthea

.PHONY: synthea-deps
synthea-deps: ## fetch Synthea from Maven Central and generate its fixed-seed FHIR R4 patients into SYNTHEA_DIR
	@CAREHUB_M2_REPO=$(CAREHUB_M2_REPO) tests/synthea/generate.sh $(SYNTHEA_DIR)

# Tools the suites use outside Go, installed with apt-get when missing (as root; otherwise the
# command to run is printed): Chromium (the explorer's browser tests), jq and curl (README's
# tour), Java 17 and Maven (the FHIR client suite), cmake and g++ (llama.cpp's server, built from
# source by llamacpp-deps).
TEST_APT_PKGS := chromium:/usr/bin/chromium jq:jq curl:curl openjdk-17-jdk-headless:javac maven:mvn cmake:cmake g++:g++

.PHONY: test-deps
test-deps: postgres-binaries node-deps fuzz-deps fhir-py-deps pyclient-deps onnxruntime-deps mlserver-deps llamacpp-deps ## install everything make test needs on a fresh Debian/Ubuntu machine (PostgreSQL, Chromium, jq, npm packages, Schemathesis, the Python FHIR and webhook clients, Maven, HAPI FHIR, Synthea's patients, ONNX Runtime, MLServer, llama.cpp's server)
	@missing=; for p in $(TEST_APT_PKGS); do 		command -v $${p#*:} >/dev/null 2>&1 || missing="$$missing $${p%%:*}"; 	done; 	if [ -n "$$missing" ]; then 		if [ "$$(id -u)" != 0 ]; then echo "missing:$$missing; run: sudo apt-get install -y$$missing" >&2; exit 1; fi; 		echo "installing$$missing (apt-get)..." >&2; 		DEBIAN_FRONTEND=noninteractive apt-get update -qq && 		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; 	fi
	@$(MAKE) --no-print-directory -j1 fhir-client-deps synthea-deps # one Maven at a time on the shared repository

MLSERVER_VENV ?= $(HOME)/.cache/carehub/mlserver-venv
export MLSERVER_VENV

.PHONY: mlserver-deps
mlserver-deps: ## install MLServer, pinned in tests/mlserver/requirements.txt, into MLSERVER_VENV (the Open Inference Protocol peer of processors/inference/oip's tests)
	@MLSERVER_VENV=$(MLSERVER_VENV) PYTHON=$(PYTHON) tests/mlserver/setup.sh >/dev/null

LLAMACPP_VENV ?= $(HOME)/.cache/carehub/llamacpp-venv
export LLAMACPP_VENV

.PHONY: llamacpp-deps
llamacpp-deps: ## build llama.cpp's OpenAI-compatible server (llama-cpp-python, pinned in tests/llamacpp/requirements.txt) and its tiny test model into LLAMACPP_VENV
	@LLAMACPP_VENV=$(LLAMACPP_VENV) PYTHON=$(PYTHON) tests/llamacpp/setup.sh >/dev/null

# CAREHUB_REQUIRE_SUITES=1 (CI sets it) turns a suite's skip for a missing tool into a failure.
.PHONY: test
test: test-deps ## run the whole suite (real Postgres, embedded Kafka, Node and Chromium clients, Schemathesis, README's tour)
	$(GO) vet ./...
	CAREHUB_SCHEMATHESIS=$(FUZZ_VENV)/bin/schemathesis CAREHUB_FHIR_PY_VENV=$(FHIR_PY_VENV) CAREHUB_SYNTHEA_DIR=$(SYNTHEA_DIR) \
		$(GO) test $(GOTESTFLAGS) ./...

.PHONY: fuzz-api
fuzz-api: postgres-binaries fuzz-deps ## fuzz the REST and GraphQL APIs with Schemathesis, driven by the OpenAPI document and the GraphQL schema, on a fresh node
	CAREHUB_SCHEMATHESIS=$(FUZZ_VENV)/bin/schemathesis $(GO) test $(GOTESTFLAGS) -v -run '^(TestOpenAPIFuzz|TestGraphQLFuzz)$$' ./e2e/contracttest/

# Packages with whole-node tests, the ones that race with background work.
FLAKE_PKGS   ?= ./api/... ./e2e/... ./processors/... ./ingest/...
FLAKE_RUNS   ?= 10

.PHONY: flake-hunt
flake-hunt: postgres-binaries node-deps ## run FLAKE_PKGS FLAKE_RUNS times under CPU contention; report each failure with its seed
	FLAKE_PKGS="$(FLAKE_PKGS)" FLAKE_RUNS=$(FLAKE_RUNS) GOTESTFLAGS="$(GOTESTFLAGS)" .ci/flake-hunt

.PHONY: kafka-up
kafka-up: ## fetch (once) and start this checkout's single-node Apache Kafka (KAFKA_PORT; kafka.sh brokers)
	$(KAFKA_SH) up

.PHONY: kafka-down
kafka-down: ## stop this checkout's Apache Kafka broker (its data stays for the next kafka-up)
	$(KAFKA_SH) down

.PHONY: kafka-cluster-up
kafka-cluster-up: ## fetch (once) and start this checkout's three-broker Apache Kafka cluster, RF 3, min ISR 2 (KAFKA_CLUSTER_PORT; cluster.sh brokers)
	$(KAFKA_CLUSTER_SH) up

.PHONY: kafka-cluster-down
kafka-cluster-down: ## stop this checkout's three-broker Kafka cluster (its data stays for the next kafka-cluster-up)
	$(KAFKA_CLUSTER_SH) down

# The Kafka-touching suites, run again against the real broker. make test already ran the same
# code under the race detector; here the broker is what is tested, and -race would double the
# stage's time. Packages share the broker KAFKA_PARALLEL at a time: every test names its own
# topics and groups (kafkatest.Name; servertest gives each node a --kafka-namespace). The tests
# that stop and restart the broker (KAFKA_STOP_TESTS) would break the others' connections, so
# they run afterwards, alone. Two whole-node suites are left to make test: the FHIR base's
# (api/fhir: resources and search in Postgres, nothing of the broker or the event log that the
# e2e suites do not drive) and the contract fuzzer's (e2e/contracttest: request shapes); they
# are the stage's two longest and would take CI past its 40 minutes. The inference runtimes'
# own suites (processors/inference: ONNX Runtime in-process, MLServer over HTTP) touch no broker.
KAFKA_SKIP_PKGS  := carehub/api/fhir carehub/e2e/contracttest carehub/processors/inference/onnx carehub/processors/inference/oip \
	carehub/processors/inference/chat
KAFKA_PKGS        = ./storage/kafka/... ./storage/outbox/... ./storage/idempotency/... ./ingest/... \
	$(filter-out $(KAFKA_SKIP_PKGS),$(shell $(GO) list ./processors/... ./api/... ./e2e/... 2>/dev/null))
KAFKA_TESTFLAGS  ?= -count=1 -timeout 25m -shuffle=on
KAFKA_PARALLEL   ?= 2
KAFKA_STOP_TESTS := ^(TestBrokerOutage|TestBrokerRestart)$$
# Broker- and store-blind tests inside packages the real-engine stages run, left to make test:
# external inference servers (HTTP to MLServer and to llama.cpp's server, killed and restarted)
# exercise nothing of the broker or the event store.
KAFKA_BLIND_TESTS := ^(TestBackendDeployment|TestLLMAgent)$$
KAFKA_STOP_PKGS  := ./storage/kafka ./e2e/pipelinetest

.PHONY: test-kafka
test-kafka: postgres-binaries node-deps onnxruntime-deps ## run the Kafka-touching suites against a real Apache Kafka broker
	@set -e; $(KAFKA_SH) up; trap '$(KAFKA_SH) down' EXIT; \
	export CAREHUB_TEST_KAFKA_BROKERS=$$($(KAFKA_SH) brokers) CAREHUB_TEST_KAFKA_SCRIPT=$(CURDIR)/$(KAFKA_SH); \
	rc=0; $(GO) test $(KAFKA_TESTFLAGS) -p $(KAFKA_PARALLEL) -skip '$(KAFKA_STOP_TESTS)|$(KAFKA_BLIND_TESTS)' $(KAFKA_PKGS) || rc=$$?; \
	$(GO) test $(KAFKA_TESTFLAGS) -p 1 -run '$(KAFKA_STOP_TESTS)' $(KAFKA_STOP_PKGS) || rc=$$?; exit $$rc

# Every committed generated file, with the test that regenerates it and fails on drift:
# schemas/kafka/event-types.json (kernel/events.Catalogue), the explorer bundle
# api/graphql/explorer/dist and its test schema testdata/introspection.json (web/).
DRIFT_TESTS := '^(TestCatalogueFile|TestBundleDrift|TestIntrospectionDrift)$$'
DRIFT_PKGS  := ./kernel/events ./api/graphql/explorer

.PHONY: lint
lint: node-deps ## gofmt, go vet, go.mod/go.sum tidy, generated files up to date
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C loadtest/charts vet . && $(GO) -C loadtest/charts test -count=1 . # a module of its own: ./... skips it
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	CAREHUB_REQUIRE_GENERATORS=1 $(GO) test -count=1 -run $(DRIFT_TESTS) $(DRIFT_PKGS)

.PHONY: generate
generate: ## regenerate generated files (event-type catalogue, explorer bundle, its test schema)
	$(GO) generate ./...
	$(MAKE) explorer

.PHONY: explorer
explorer: ## rebuild the GraphiQL explorer bundle and its test schema from the npm lockfile
	cd api/graphql/explorer/web && npm ci --no-audit --no-fund --loglevel=error && npm run build && \
		node introspection.mjs > ../testdata/introspection.json

.PHONY: bench
bench: postgres-binaries ## run the Go benchmarks
	$(GO) test -run '^$$' -bench . -benchmem ./...

BENCH_RESULTS ?= loadtest/results
BENCH_DURATION ?= 20s
# The observation runs last a minute: issue 20 asks for a sustained rate, and a minute holds
# several checkpoints and the stalls a 20 s window can miss or be dominated by (the raw
# baselines still run 20 s each: loadtest.MaxRawPhase).
BENCH_OBS_DURATION ?= 60s

.PHONY: bench-pipeline
bench-pipeline: postgres-binaries ## observation path end to end with its raw baselines (produce, bare HTTP, COPY) and again at 80 % of its stored rate, then with the event log as a node runs it, then the event pipeline's suite; JSON, PNG chart and HTML page of each under BENCH_RESULTS
	$(GO) build -o bin/loadtest ./loadtest/cmd/loadtest
	$(GO) build -o bin/eventload ./loadtest/cmd/eventload
	bin/loadtest -self -devices 16 -batch 100 -duration $(BENCH_OBS_DURATION) -paced 0.8 -results $(BENCH_RESULTS)
	bin/loadtest -self -eventlog postgres -devices 16 -batch 100 -duration $(BENCH_OBS_DURATION) -results $(BENCH_RESULTS)
	bin/eventload -self -suite -export -quiet -d $(BENCH_DURATION) -results $(BENCH_RESULTS)
	$(MAKE) --no-print-directory charts DIR=$(BENCH_RESULTS)

# The load reports' charts: loadtest/charts, a module of its own so that gonum's plotting stays
# out of the service's go.mod, draws <report>.png and <report>.html beside each JSON report under
# DIR that has none newer yet (go -C runs it inside loadtest/charts: the path is made absolute).
.PHONY: charts
charts: ## draw the PNG chart and HTML page of each load report under DIR (default BENCH_RESULTS)
	$(GO) -C loadtest/charts run . $(abspath $(or $(DIR),$(BENCH_RESULTS)))

# FHIR Subscriptions under load (issue 57; loadtest/cmd/subload): 1,000 patients with a rest-hook
# subscription each on a node in process, observations posted unpaced for SUBS_DURATION (the
# stored rate, notifications/s), then at 80 % of it for as long: observation accepted → its
# notification received, p50/p90/p99/max, and what was missed, repeated or out of order.
SUBS_DURATION ?= 30s

.PHONY: bench-subscriptions
bench-subscriptions: postgres-binaries ## FHIR Subscriptions: 1,000 rest-hook subscriptions, the stored rate, then accepted → notified p50/p99 at 80 % of it (SUBS_DURATION a phase); JSON, PNG chart and HTML page under BENCH_RESULTS
	$(GO) build -o bin/subload ./loadtest/cmd/subload
	bin/subload -self -subs 1000 -d $(SUBS_DURATION) -paced 0.8 -results $(BENCH_RESULTS)
	$(MAKE) --no-print-directory charts DIR=$(BENCH_RESULTS)

# FHIR Bulk Data export at scale (issue 57; api/fhir BenchmarkBulkExport): SYNTHEA_BENCH_PATIENTS
# Synthea patients (the same generator and seed as the tests', made once into SYNTHEA_BENCH_DIR)
# loaded through /fhir/R4, then a system export as a client makes it (kick-off to the last file
# downloaded) against a raw COPY of the same rows, in the same run.
SYNTHEA_BENCH_PATIENTS ?= 1000
SYNTHEA_BENCH_DIR      ?= $(HOME)/.cache/carehub/synthea-$(SYNTHEA_BENCH_PATIENTS)

.PHONY: bench-bulk
bench-bulk: postgres-binaries ## FHIR Bulk Data export of SYNTHEA_BENCH_PATIENTS (1,000) Synthea patients, resources/s against the stores' raw COPY in the same run
	@SYNTHEA_PATIENTS=$(SYNTHEA_BENCH_PATIENTS) CAREHUB_M2_REPO=$(CAREHUB_M2_REPO) tests/synthea/generate.sh $(SYNTHEA_BENCH_DIR)
	CAREHUB_SYNTHEA_DIR=$(SYNTHEA_BENCH_DIR) CAREHUB_BULK_COPIES=1 \
		$(GO) test -run '^$$' -bench BulkExport -benchtime 1x -timeout 90m ./api/fhir/

# The peer benchmark (loadtest/cmd/peerbench): FHIR transaction import into carehub and into the
# HAPI FHIR JPA server 8.8.0 (loadtest/peers/hapi, built from Maven Central into CAREHUB_M2_REPO),
# the same Bundles to both in one run: vitals (a Patient and 100 Observations each) and the
# Synthea patients (SYNTHEA_DIR), at 1 and 4 clients, each server warmed up first; FHIR search
# (search, not in the default list: a patient's vitals by code and date, paged, from vitals
# Bundles loaded into both); and subscription fan-out (fanout) beside a graphql-ws server on
# Node (loadtest/peers/graphqlws, its pinned npm packages installed into GRAPHQLWS_DIR), both
# reading one Apache Kafka broker's events topic (deploy/local/kafka, fetched from Maven
# Central), at PEERS_SOCKETS sockets; and Kafka → ClickHouse (analytics, not in the default
# list: carehub's event-log writer beside ClickHouse's own Kafka table engine, a backlog and
# steady rates, on a broker and a ClickHouse engine of its own, deploy/local/clickhouse).
PEERS_DURATION  ?= 20s
PEERS_WARMUP    ?= 180s
PEERS_WORKLOADS ?= vitals,synthea,fanout
PEERS_SOCKETS   ?= 2000,10000
GRAPHQLWS_DIR   ?= $(HOME)/.cache/carehub/peers/graphqlws
GRAPHQLWS_SRC   := loadtest/peers/graphqlws
# Only the peers and data the chosen workloads use are built.
peers_comma     := ,
peers_workloads  = $(subst $(peers_comma), ,$(PEERS_WORKLOADS))
PEERS_NEEDS      = $(if $(filter synthea,$(peers_workloads)),synthea-deps) \
	$(if $(filter vitals synthea search,$(peers_workloads)),peers-hapi-deps) \
	$(if $(filter fanout,$(peers_workloads)),peers-graphqlws-deps) \
	$(if $(filter analytics,$(peers_workloads)),peers-analytics-deps)

.PHONY: peers-deps
peers-deps: peers-hapi-deps peers-graphqlws-deps peers-analytics-deps ## build every peer of bench-peers (HAPI FHIR JPA 8.8.0; graphql-ws on Node and its Kafka broker; Kafka and ClickHouse for analytics)

.PHONY: peers-hapi-deps
peers-hapi-deps: ## build the HAPI FHIR JPA server 8.8.0 peer (loadtest/peers/hapi) from Maven Central into CAREHUB_M2_REPO
	@CAREHUB_M2_REPO=$(CAREHUB_M2_REPO) loadtest/peers/hapi/run.sh --build-only

.PHONY: peers-graphqlws-deps
peers-graphqlws-deps: ## install the graphql-ws peer's npm packages (loadtest/peers/graphqlws lockfile) into GRAPHQLWS_DIR, and fetch Apache Kafka
	@if ! cmp -s $(GRAPHQLWS_SRC)/package-lock.json $(GRAPHQLWS_DIR)/package-lock.json || [ ! -d $(GRAPHQLWS_DIR)/node_modules ]; then \
		mkdir -p $(GRAPHQLWS_DIR) && cp $(GRAPHQLWS_SRC)/package.json $(GRAPHQLWS_SRC)/package-lock.json $(GRAPHQLWS_DIR)/ && \
		(cd $(GRAPHQLWS_DIR) && npm ci --no-audit --no-fund --loglevel=error); \
	fi
	@$(KAFKA_SH) prepare

.PHONY: peers-analytics-deps
peers-analytics-deps: ## fetch Apache Kafka and the ClickHouse engine for bench-peers' analytics workload
	@$(KAFKA_SH) prepare
	@$(CLICKHOUSE_SH) fetch

.PHONY: bench-peers
bench-peers: postgres-binaries build $(PEERS_NEEDS) ## carehub beside its peers, same bytes and machine: FHIR import and search vs HAPI FHIR JPA 8.8.0, subscription fan-out vs graphql-ws, Kafka → ClickHouse vs ClickHouse's Kafka engine (PEERS_WORKLOADS, PEERS_DURATION per phase, PEERS_WARMUP, PEERS_SOCKETS); JSON, PNG and HTML under BENCH_RESULTS, each workload's and one peers-summary of every goal met or not
	$(GO) build -o bin/peerbench ./loadtest/cmd/peerbench
	CAREHUB_M2_REPO=$(CAREHUB_M2_REPO) bin/peerbench -carehub $(BIN) -synthea $(SYNTHEA_DIR) -workloads $(PEERS_WORKLOADS) \
		-d $(PEERS_DURATION) -warmup $(PEERS_WARMUP) -fanout-sockets $(PEERS_SOCKETS) -graphqlws-modules $(GRAPHQLWS_DIR) \
		-kafka-sh $(KAFKA_SH) -clickhouse-sh $(CLICKHOUSE_SH) -results $(BENCH_RESULTS)
	$(MAKE) --no-print-directory charts DIR=$(BENCH_RESULTS)

SOAK_DURATION ?= 10m

.PHONY: soak-attack
soak-attack: postgres-binaries build ## issue 51's soak: two tenants' traffic for SOAK_DURATION alone, then again while a third tenant's keys run every known attack; fails on a legitimate error or a p99 over 2x
	$(GO) run ./loadtest/cmd/attacksoak -carehub $(BIN) -d $(SOAK_DURATION)

.PHONY: clean
clean: ## remove build output (not DATA_DIR)
	rm -rf bin

.PHONY: clickhouse-up
clickhouse-up: ## fetch (once) and start this checkout's ClickHouse engine (CLICKHOUSE_TCP_PORT; clickhouse.sh url)
	$(CLICKHOUSE_SH) up

.PHONY: clickhouse-down
clickhouse-down: ## stop this checkout's ClickHouse engine (its data stays for the next clickhouse-up)
	$(CLICKHOUSE_SH) down

# The suites whose answers come from the event and audit store: the ClickHouse store's
# conformance suites, and the whole-node suites that read the event log and the audit log end to
# end (authorization and PHI matrices, REST and GraphQL reads, publish → log). Every other
# whole-node suite links chtest too (through servertest) and would run on ClickHouse as well:
# `make test-clickhouse CLICKHOUSE_PKGS="$(make -s clickhouse-all-pkgs)"` runs them all, and so
# does `make clickhouse-up && CAREHUB_CLICKHOUSE_URL=… make test` (or make test-kafka, which is how
# .ci/run runs every whole-node suite on both real engines at once). make test already ran the
# same code under the race detector; here the store is what is tested, and -race would double
# the stage's time.
CLICKHOUSE_PKGS      ?= ./storage/clickhouse/... ./e2e/authztest ./api/rest ./api/graphql ./e2e/pipelinetest
CLICKHOUSE_ALL_PKGS   = $(shell $(GO) list -test -f '{{.ImportPath}}{{range .Deps}} {{.}}{{end}}' ./... | \
	awk '$$1 ~ /\.test$$/ && / carehub\/storage\/clickhouse\/chtest( |$$)/ {sub(/\.test$$/, "", $$1); print $$1}')

.PHONY: clickhouse-all-pkgs
clickhouse-all-pkgs: ## list every test package that can run on ClickHouse
	@echo $(CLICKHOUSE_ALL_PKGS)

CLICKHOUSE_TESTFLAGS ?= -count=1 -timeout 25m -shuffle=on

.PHONY: test-clickhouse
test-clickhouse: postgres-binaries node-deps fuzz-deps onnxruntime-deps mlserver-deps ## run the suites that use the event and audit store on a real ClickHouse engine
	@set -e; $(CLICKHOUSE_SH) up; trap '$(CLICKHOUSE_SH) down' EXIT; \
	CAREHUB_CLICKHOUSE_URL=$$($(CLICKHOUSE_SH) url) CAREHUB_SCHEMATHESIS=$(FUZZ_VENV)/bin/schemathesis \
	$(GO) test $(CLICKHOUSE_TESTFLAGS) -skip '$(KAFKA_BLIND_TESTS)' $(CLICKHOUSE_PKGS)

ANALYSTS_CH_EVENTS ?= 100000000
ANALYSTS_PG_EVENTS ?= 10000000
ANALYSTS_PG_URL    ?=

# The analysts' query shapes at scale (docs/PERFORMANCE.md, Analysts): the ClickHouse engine
# generates ANALYSTS_CH_EVENTS events into a fresh database (dropped at the end); Postgres
# generates ANALYSTS_PG_EVENTS into ANALYSTS_PG_URL's empty database, or into a throwaway local
# cluster under /tmp (stopped and deleted at the end). Prints p50/p99 per shape and the export
# rate. The defaults take ~6 GB of disk and most of an hour on a shared 2-core machine.
.PHONY: bench-analysts
bench-analysts: ## load events at scale and time the analysts' queries (ClickHouse, then Postgres)
	@set -e; $(CLICKHOUSE_SH) up; $(GO) build -o bin/analystload ./loadtest/cmd/analystload; \
	db=analysts_bench_$$(date +%s); pg=$$(mktemp -d /tmp/carehub-analysts-pg.XXXXXX); url=$$($(CLICKHOUSE_SH) url); \
	trap '$(CLICKHOUSE_SH) query "DROP DATABASE IF EXISTS $$db" >/dev/null; rm -rf $$pg' EXIT; \
	$(CLICKHOUSE_SH) query "CREATE DATABASE $$db" >/dev/null; \
	bin/analystload -store clickhouse -url $${url%/*}/$$db -events $(ANALYSTS_CH_EVENTS); \
	if [ -n "$(ANALYSTS_PG_URL)" ]; then bin/analystload -store postgres -url "$(ANALYSTS_PG_URL)" -events $(ANALYSTS_PG_EVENTS) -chunk 1000000; \
	else bin/analystload -store postgres -pg-dir $$pg -pg-stop -events $(ANALYSTS_PG_EVENTS) -chunk 1000000; fi

# Scale-out on the real engines, each fresh: its own Kafka broker, on SCALE_KAFKA_PORT (default
# four above this checkout's Kafka port, inside its block) and not on kafka-up's, whose topics
# other suites fill, and a ClickHouse database of its own.
SCALE_KAFKA_PORT ?=

.PHONY: test-scaleout
test-scaleout: postgres-binaries onnxruntime-deps ## api, ingest and processors as separate processes on real Kafka and ClickHouse; SIGKILL the processors mid-load and count
	@set -e; kafka=$$($(KAFKA_SH) brokers); \
	export KAFKA_PORT=$(or $(SCALE_KAFKA_PORT),$$(($${kafka##*:} + 4))) KAFKA_STATE_DIR=$$(mktemp -d /tmp/carehub-scale-kafka.XXXXXX); \
	trap '$(KAFKA_SH) down; rm -rf "$$KAFKA_STATE_DIR"; $(CLICKHOUSE_SH) down' EXIT; \
	$(CLICKHOUSE_SH) up; $(KAFKA_SH) up; \
	CAREHUB_TEST_KAFKA_BROKERS=$$($(KAFKA_SH) brokers) CAREHUB_CLICKHOUSE_URL=$$($(CLICKHOUSE_SH) url) \
	$(GO) test -count=1 -timeout 15m -v -run '^TestScaleOut' ./cmd/carehub/scaletest

# The fault suite (issue 56, docs/RELIABILITY.md): api, ingest and processors processes on a
# three-broker Kafka cluster, a ClickHouse server and a Postgres cluster the suite starts itself
# on free ports (it kills and stops them), each fault injected under load and counted. The full
# disk of the embedded defaults mounts a tmpfs, and the network cut puts a node in a network
# namespace (both need root). FAULTS is a go test -run pattern of the faults to run
# (TestFaults/broker, /leader, /clickhouse, /postgres; TestFaultPostgresFailover;
# TestFaultNetworkCut; TestFaultDiskFull), e.g.
# FAULTS='TestFaults/(broker|clickhouse)'; FAULT_OUTAGE is how long ClickHouse stays down.
FAULTS       ?= ^TestFault
FAULT_OUTAGE ?= 2m

.PHONY: test-faults
test-faults: postgres-binaries onnxruntime-deps ## kill brokers, stop ClickHouse, crash Postgres, cut a node off, fill the disk, each under load; print per fault what was acknowledged, stored, lost, duplicated and how long recovery took
	@$(KAFKA_SH) fetch && $(CLICKHOUSE_SH) fetch
	CAREHUB_TEST_FAULTS=1 CAREHUB_TEST_FAULT_OUTAGE=$(FAULT_OUTAGE) \
	$(GO) test -count=1 -timeout 40m -v -run '$(FAULTS)' ./cmd/carehub/scaletest

DEPLOY_VENV  ?= $(HOME)/.cache/carehub/deploy-venv
DEPLOY_REQS  := deploy/requirements.txt
HELM_VERSION ?= v3.22.0
HELM         ?= $(HOME)/.cache/carehub/bin/helm-$(HELM_VERSION)

.PHONY: deploy-tools
deploy-tools: ## install the deployment files' checkers: deploy/requirements.txt into DEPLOY_VENV, helm built from the Go module proxy
	@if ! cmp -s $(DEPLOY_REQS) $(DEPLOY_VENV)/requirements.txt; then \
		$(PYTHON) -m venv $(DEPLOY_VENV) && \
		$(DEPLOY_VENV)/bin/pip install -q --disable-pip-version-check -r $(DEPLOY_REQS) && \
		cp $(DEPLOY_REQS) $(DEPLOY_VENV)/requirements.txt; \
	fi
	@if [ ! -x $(HELM) ]; then \
		tmp=$$(mktemp -d) && GOBIN=$$tmp $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
		mkdir -p $(dir $(HELM)) && mv $$tmp/helm $(HELM) && rm -rf $$tmp; \
	fi

.PHONY: lint-deploy
lint-deploy: deploy-tools ## lint the Dockerfile, validate the Compose file and the Helm chart (defaults, every role on), check their CAREHUB_* against the flags
	DEPLOY_VENV=$(DEPLOY_VENV) HELM=$(HELM) deploy/lint.sh
	$(GO) test -count=1 -run '^(TestDeployFilesNameRealFlags|TestHealthCommand)$$' ./cmd/carehub
