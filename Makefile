# nprdma — the two commands a newcomer needs are `make demo` and `make test`.
# Every target installs what it needs first (scripts/deps.sh).

GO        ?= go
BIN       := bin
# Packages with goroutines sharing state: tested under the race detector.
RACE_PKGS  := ./blockdev/... ./swap/... ./nprdma/... ./nvme/... ./target/... ./initiator/... ./integration/... ./internal/...
# Packages with allocation tests (TestHotPathAllocations, TestSlowPathAllocatesNothing,
# TestCommandPathAllocations).
ALLOC_PKGS := ./nprdma/tcp ./nprdma/shm ./integration/np/npread ./target
# The rest: benchmark code (its own quick tests) and the CLIs.
OTHER_PKGS := ./bench/... ./cmd/...
# Short fuzz runs in `make test`; `make fuzz FUZZTIME=10m` for a long run.
FUZZTIME  ?= 10s
# Tests that take minutes (crash rounds, churn, stress) run their long versions with NPRDMA_LONG=1.

export CGO_ENABLED := 1
SHELL := bash

.PHONY: all deps build test vet fmt-check unit fuzz demo bench clean

all: build

deps:
	@scripts/deps.sh

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

unit:
	@missing=$$(comm -23 <($(GO) list ./... | sort) <($(GO) list $(RACE_PKGS) $(OTHER_PKGS) | sort)); \
	if [ -n "$$missing" ]; then echo "packages in neither RACE_PKGS nor OTHER_PKGS:"; echo "$$missing"; exit 1; fi
	$(GO) test -race -count=1 -timeout 15m $(RACE_PKGS)
	$(GO) test -count=1 -timeout 15m $(OTHER_PKGS)
	@# The race detector allocates: the allocation tests skip under it and run here.
	$(GO) test -count=1 -run 'Allocat' $(ALLOC_PKGS)

# Every decoder of bytes from outside has a Fuzz target; each runs briefly.
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

test: deps vet fmt-check build unit
	@FUZZTIME=$(FUZZTIME) $(MAKE) --no-print-directory fuzz
	@echo "make test: all passed"

demo: build
	@scripts/demo.sh

bench: build
	$(GO) run ./bench/cmd/nprdma-bench $(if $(BENCH),--mode $(BENCH))

clean:
	rm -rf $(BIN) demo-data bench/out
