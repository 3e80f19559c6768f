# nprdma — the two commands a newcomer needs are `make demo` and `make test`.
# Every target installs what it needs first (scripts/deps.sh).

GO        ?= go
BIN       := bin
# Packages with goroutines sharing state: tested under the race detector.
RACE_PKGS  := ./blockdev/... ./swap/... ./nprdma/... ./nvme/... ./target/... ./initiator/... ./integration/... ./internal/... ./lab/... ./csi/...
# Packages with allocation tests (TestHotPathAllocations, TestSlowPathAllocatesNothing,
# TestCommandPathAllocations).
ALLOC_PKGS := ./nprdma/tcp ./nprdma/shm ./integration/np/npread ./target
# The rest: benchmark code (its own quick tests), the CLIs and the manifests.
OTHER_PKGS := ./bench/... ./cmd/... ./deploy/...
# Short fuzz runs in `make test`; `make fuzz FUZZTIME=10m` for a long run.
FUZZTIME  ?= 10s
# Tests that take minutes (crash rounds, churn, stress) run their long versions with NPRDMA_LONG=1.
# Guest tests (docs/lab.md) are the tests named TestGuest*, in any package: `unit` skips them and
# `guest-test` runs them, each booting a QEMU guest through package lab.
GUEST_RUN := ^TestGuest
# `make lab LAB='--modules nvme-tcp,nvmet-tcp'`: flags of `nprdma-lab shell`.
LAB       ?=

export CGO_ENABLED := 1
SHELL := bash

.PHONY: all deps build test vet fmt-check unit guest-test lab fuzz demo bench clean

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
	$(GO) test -race -count=1 -timeout 15m -skip '$(GUEST_RUN)' $(RACE_PKGS)
	$(GO) test -count=1 -timeout 15m -skip '$(GUEST_RUN)' $(OTHER_PKGS)
	@# The race detector allocates: the allocation tests skip under it and run here.
	$(GO) test -count=1 -run 'Allocat' $(ALLOC_PKGS)

# The guest interop suite: every TestGuest* under QEMU, where the lab can run (nprdma-lab status
# says why not, and the suite is skipped with that reason).
guest-test:
	@set -o pipefail; \
	if why=$$($(GO) run ./lab/cmd/nprdma-lab status); then \
		echo "$$why"; \
		$(GO) test -race -count=1 -timeout 15m -run '$(GUEST_RUN)' $(RACE_PKGS) | sed -e '/no tests to run/d' -e '/no test files/d' && \
		$(GO) test -count=1 -timeout 15m -run '$(GUEST_RUN)' $(OTHER_PKGS) | sed -e '/no tests to run/d' -e '/no test files/d'; \
	else \
		echo "make: SKIPPING the guest tests: $$why"; \
	fi

# A root shell in a guest, set up as the guest tests are (Ctrl-A x quits).
lab: deps
	$(GO) run ./lab/cmd/nprdma-lab shell $(LAB)

# Every decoder of bytes from outside has a Fuzz target; each runs briefly.
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

test: deps vet fmt-check build unit guest-test
	@FUZZTIME=$(FUZZTIME) $(MAKE) --no-print-directory fuzz
	@echo "make test: all passed"

demo: build
	@scripts/demo.sh

# `make bench`: every judged point in 5 rounds, verdicts on the medians (docs/bench-method.md);
# BENCH=full for longer runs, BENCH=smoke for one unjudged round of everything.
bench: build
	$(GO) run ./bench/cmd/nprdma-bench $(if $(BENCH),--mode $(BENCH))

clean:
	rm -rf $(BIN) demo-data bench/out
