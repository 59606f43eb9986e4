# Runnel build, run and test entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
BIN := bin/runnel
DATA ?= ../shared/data
# Go from PATH, else the usual install place (/usr/local/go/bin), as docs/quickstart.md says.
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

.PHONY: help build run test test-long e2e-long test-short bench bench-cluster bench-compare bench-profile demo proto lint fuzz clean deps

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

deps: ## download the Go modules
	$(GO) mod download

build: ## build bin/runnel
	$(GO) build -o $(BIN) ./cmd/runnel

ARGS ?=
run: build ## run one node with embedded storage (data in ./data/dev, gRPC 127.0.0.1:7070, HTTP 127.0.0.1:7071); ARGS='--grpc-addr ...' passes flags
	./$(BIN) dev $(ARGS)

test: ## unit, bad-input and recovery tests with the race detector, the multi-process cluster tests (e2e/), a short fuzz of each decoder
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 12m $$($(GO) list ./... | grep -v /e2e)
	# The cluster tests run several node processes each: alone, so they do not starve the others' timers.
	$(GO) test -race -count=1 -timeout 12m ./e2e/
	# 10,000 executions per fuzz target: about a minute in all on a 2-core machine (20,000 took 110 s and
	# pushed `make test` past 15 minutes); `make fuzz` runs each for 60 s.
	$(MAKE) fuzz FUZZTIME=10000x

test-long: ## the 3-million-record runs (RUNNEL_LONG=1): consumer-group no-skips with member crashes, the transactional copier with kill -9s
	RUNNEL_LONG=1 $(GO) test -race -count=1 -timeout 20m -v -run 'TestGroupNoSkipsFull' ./client/
	RUNNEL_LONG=1 $(GO) test -race -count=1 -timeout 60m -v -run 'TestTransactionalCopier' ./e2e/

SEED ?=
DURATION ?= 30m
e2e-long: ## fault-injection runs: 3 nodes behind fault proxies, random faults of SEED (default: time) for DURATION under the queue, then the transactional workload (WORKLOAD=queue or txn: one of them; DISK=1 as root: fill-disk too); reports in e2e/out/ (docs/testing.md)
	RUNNEL_E2E_LONG=1 E2E_SEED=$(SEED) E2E_DURATION=$(DURATION) E2E_WORKLOAD=$(WORKLOAD) E2E_DISK=$(DISK) $(GO) test -race -count=1 -timeout 0 -v -run 'TestQueueUnderFaultsLong|TestTxnUnderFaultsLong' ./e2e/

FUZZTIME ?= 60s
fuzz: ## fuzz every decoder of untrusted bytes (every FuzzXxx target) for FUZZTIME each
	./scripts/fuzz.sh $(FUZZTIME)

bench-cluster: build ## a 3-node cluster on this machine: acks=all produce with replication factor 3 (docs/performance.md)
	./scripts/bench-cluster.sh

bench: build ## produce and consume benchmarks against a fresh local node (see docs/performance.md)
	./scripts/bench.sh

FULL ?=
bench-compare: build ## Runnel vs NATS JetStream and Redis Streams in one run (FULL=1: whole matrix; ROUNDS=N: N runs and their medians); writes bench/out/report.md
	FULL=$(FULL) ROUNDS=$(ROUNDS) ./scripts/bench-compare.sh

bench-profile: build ## CPU and allocation profiles of a node under produce and consume load, into bench/out/
	./scripts/bench-profile.sh

demo: build ## stream the 3 million real flight records through a fresh node and check per-key order
	./scripts/demo.sh $(DATA)/flights-3m.ndjson.zst

proto: ## regenerate api/runnel/v1 from its .proto (needs protoc: apt-get install protobuf-compiler)
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	GOBIN=$(HOME)/go/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(HOME)/go/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	protoc -I api --go_out=api --go_opt=paths=source_relative \
		--go-grpc_out=api --go-grpc_opt=paths=source_relative api/runnel/v1/runnel.proto api/runnel/v1/groups.proto api/runnel/v1/cluster.proto api/runnel/v1/txn.proto

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean: ## remove build output and the dev node's data
	rm -rf bin data/dev
