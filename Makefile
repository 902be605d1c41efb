# kpush — targets mirror CI: `make test` is what .ci/run runs.
SHELL := /bin/bash
GO ?= go
export KPUSH_TOOLS := $(CURDIR)/.tools/bin
KPUSH_DATA ?= $(HOME)/.kpush

.PHONY: all tools build image dev test fuzz bench verify clean

all: build

## tools: build the tool binaries kpush runs beside itself (cached; see tools/build.sh)
tools:
	@tools/packages.sh
	@tools/build.sh >/dev/null

## build: build bin/kpush
build:
	$(GO) build -o bin/kpush ./cmd/kpush

## image: build kpush's container image with ko (no Docker) onto a base made from Debian packages
## (git, dash, libc, CA bundle), offline, into a local registry; prints REGISTRY/kpush@sha256:…
## IMAGE_REGISTRY=host:port pushes to a running registry instead (see tools/image.sh)
image: tools
	@tools/image.sh

## dev: set up everything and run `kpush dev` (SSH 127.0.0.1:2222, apps on http://APP.localhost:8080)
dev: build
	@tools/packages.sh
	@KPUSH_TOOLS_ONLY="lifecycle launcher registry bwrap busybox" tools/build.sh >/dev/null
	@[ -n "$$KPUSH_AUTHORIZED_KEYS" ] || ls $(HOME)/.ssh/*.pub >/dev/null 2>&1 || { mkdir -p -m 700 $(HOME)/.ssh && \
		ssh-keygen -q -t ed25519 -N '' -f $(HOME)/.ssh/id_ed25519 && \
		echo "kpush: created the SSH key $(HOME)/.ssh/id_ed25519 for git push"; }
	bin/kpush dev --data $(KPUSH_DATA)

## test: every test, unit to end-to-end, against real git, SSH, lifecycle, registry and kube-apiserver,
## then every fuzz target for a bounded time (see fuzz)
test: tools
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 40m ./...
	@GO=$(GO) tools/fuzz.sh

## fuzz: run every fuzz target (go test -fuzz), one at a time, KPUSH_FUZZTIME each (default 10s);
## FUZZ_PKGS=./gitserver/... picks packages
fuzz:
	@GO=$(GO) tools/fuzz.sh $(FUZZ_PKGS)

## bench: benchmarks, side by side with native git where it applies
bench: tools
	$(GO) test -run '^$$' -bench . -benchmem ./...

## verify: formatting and module tidiness
verify:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) mod tidy -diff

clean:
	rm -rf bin
