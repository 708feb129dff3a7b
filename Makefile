# Warren — build, test and benchmark targets. `make test` is what CI runs.
SHELL    := bash
GO       ?= go
PKGS     := ./...
# Packages with goroutines or shared state run under the race detector.
RACE_PKGS := ./queue/... ./netio/... ./client/... ./cmd/... ./segment/...

.PHONY: all build run test test-race vet fmt-check lint bench bench-compare bench-million fuzz vectors tools

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o bin/warrend ./cmd/warrend

# Start a broker with the defaults: native protocol on 127.0.0.1:5680,
# HTTP (/metrics, /healthz, /readyz) on 127.0.0.1:15680, data in ./warren-data.
run:
	$(GO) run ./cmd/warrend

test: fmt-check vet
	$(GO) test -count=1 -timeout 5m $(PKGS)
	$(GO) test -count=1 -timeout 5m -race $(RACE_PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0 $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Fuzz the frame decoder; FUZZTIME=10m make fuzz for a longer run.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz=FuzzDecode -fuzztime=$(FUZZTIME) ./wire

# Regenerate spec/vectors from the Go cases (review the diff!).
vectors:
	$(GO) test ./wire -run TestVectors -update

# Standard scenarios against Warren and, when it answers on 127.0.0.1:5672,
# RabbitMQ (classic and quorum queues), side by side. Starts its own
# warrend on 127.0.0.1:5690. Writes bench-compare.md.
COMPARE_DURATION ?= 10s
bench-compare:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest
	@bin/warrend --listen 127.0.0.1:5690 --http 127.0.0.1:15690 --data $$(mktemp -d) --log-level warn & \
	pid=$$!; trap "kill $$pid" EXIT; \
	until (exec 3<>/dev/tcp/127.0.0.1/5690) 2>/dev/null; do sleep 0.1; done; \
	bin/warren-loadtest compare --warren-url warren://guest:guest@127.0.0.1:5690 \
		--duration $(COMPARE_DURATION) --out bench-compare.md
	@cat bench-compare.md

# The 1,000,000 msg/s validation against a running broker (WARREN_URL).
WARREN_URL ?= warren://guest:guest@127.0.0.1:5680
bench-million:
	$(GO) run ./cmd/warren-loadtest --scenario million --url $(WARREN_URL) --json million.json
