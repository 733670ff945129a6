# l4lb build, test and install.
#
#   make            build bin/l4lbd and bin/l4lbctl
#   make deps       install the Debian packages tests need, mount bpffs (root)
#   make generate   recompile the BPF C with clang-19 and regenerate the Go bindings
#   make check      the fast inner loop: gofmt, go vet, staticcheck, go test -short (no root needed)
#   make test       every test, privileged ones included (run as root; CI runs this)
#   make lint       go vet + staticcheck
#   make demo       the demo topology in network namespaces (root)
#   make bench      benchmarks, each next to its baseline
#   make bench-control  one endpoint change end to end (file, override; CONTROL_PATHS adds health, consul, kubernetes) at 100-10,000 services, against BASE's l4lbd (root)
#   make bench-ab   the working tree's datapath C against BASE's (default HEAD), in one process (root)
#   make fuzz       the datapath fuzzer for FUZZTIME (default 10m; root)
#   make compare    l4lb next to a kube-proxy-shaped iptables setup (root)
#   make install    binaries, systemd units and /etc/l4lb/l4lb.toml (PREFIX=/usr/local)
#   make deb        bin/l4lb_VERSION_ARCH.deb (nfpm, from packaging/)

GO        ?= go
PREFIX    ?= /usr/local
DESTDIR   ?=
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/l4lb/l4lb/lb/daemon.Version=$(VERSION)
MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)

# bpf/gen.go passes these to clang through bpf2go. The multiarch include
# directory provides <asm/types.h> for the UAPI headers.
# BPF_EXTRA_CFLAGS: measurement builds only (docs/datapath.md), never committed.
export BPF_CFLAGS := -O2 -g -Wall -Werror -I/usr/include/$(MULTIARCH) $(BPF_EXTRA_CFLAGS)

# Generated BPF artefacts, committed and checked by `make check-generate`.
GENERATED := $(wildcard bpf/*_bpfel.go bpf/*_bpfel.o)

# Test settings: privileged tests fail instead of skipping when not root.
export L4LB_PRIVILEGED_TESTS := 1
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: all build check bench-control deps deps-demo deps-compare compare generate check-generate check-tidy kube-tools test test-unit lint demo bench failover bench-ab fuzz install uninstall deb clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/l4lbd ./cmd/l4lbd
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/l4lbctl ./cmd/l4lbctl

# What a fresh Debian 12 + Go machine lacks (scripts/deps.sh, shared with
# .ci/run): installed when run as root, otherwise named. Idempotent.
deps:
	@scripts/deps.sh test

deps-demo:
	@scripts/deps.sh demo

deps-compare:
	@scripts/deps.sh compare

generate:
	cd bpf && $(GO) generate ./...

# Regenerating from the committed C must reproduce the committed objects
# byte for byte; otherwise someone changed C without regenerating.
check-generate:
	@sum() { sha256sum $(GENERATED); }; before=$$(sum); \
	$(MAKE) --no-print-directory generate >/dev/null; \
	after=$$(sum); \
	if [ "$$before" != "$$after" ]; then \
		echo "generated BPF files were stale (C changed without make generate); regenerated:"; \
		git --no-pager diff --stat -- bpf/ 2>/dev/null; exit 1; fi; \
	echo "check-generate: BPF objects match their sources"

# The real Consul agent of the discovery/consul tests: v1.14.11, the last
# MPL-2.0 release (later ones are BUSL; never bump it). It is built from the
# tools module in tests/tools so that its dependencies stay out of go.mod;
# the first build takes a few minutes, later ones come from the Go cache.
CONSUL := $(BIN)/consul
$(CONSUL): tests/tools/go.mod tests/tools/go.sum
	cd tests/tools && $(GO) build -o $(abspath $(CONSUL)) github.com/hashicorp/consul

# The kube-apiserver (v1.37.2) and etcd (v3.7.3) of the discovery/kubernetes
# tests, built from the tools modules in tests/kubetools so that
# k8s.io/kubernetes never enters go.mod, into a cache outside the checkout
# keyed by version (${XDG_CACHE_HOME:-~/.cache}/l4lb/): the first build
# takes about 11 minutes on 2 cores (modules downloaded too) and ~3 GB of
# memory, later ones are skipped. scripts/kube-tools.sh --print says where they are.
kube-tools:
	@scripts/kube-tools.sh

# go.mod and go.sum must be what `go mod tidy` makes them: a direct
# dependency marked indirect, or a stale sum, fails the build here.
check-tidy:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	@cd packaging && $(GO) mod tidy -diff || { echo "packaging/go.mod is not tidy: cd packaging && go mod tidy"; exit 1; }

# The fast inner loop, under two minutes with a warm Go cache: formatting,
# vet, staticcheck and every test that needs neither root, a namespace, a
# bpffs nor the Consul / kube-apiserver / BIRD binaries (those skip under
# -short, saying so). The pipeline's and reconciler's table tests run here.
# .ci/run runs it before `make test`, so that a mistake fails in minutes.
check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	L4LB_PRIVILEGED_TESTS= $(GO) test -short -count=1 ./...

test: deps check-generate check-tidy build $(CONSUL) kube-tools
	$(GO) vet ./...
	$(GO) test $(TESTFLAGS) ./...

lint: check-tidy
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

demo: deps-demo build
	$(GO) run ./tests/demo -l4lbd $(BIN)/l4lbd -config etc/examples/demo.toml

# Benchmarks, each next to its baseline in the same run: Maglev builds
# against a textbook build, the reconciler at 10 / 1,000 / 10,000 services,
# and the datapath (needs root, about 7 GB of memory and 3 minutes) per
# packet path next to floor programs.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./lb/maglev ./lb/reconciler
	$(GO) run ./tests/bench

# The datapath built from the working tree's C against the object committed
# at BASE (a commit; default HEAD), every XDP path of both timed in one
# process, round by round: two processes differ by more than most changes
# to the C are worth (docs/datapath.md). C is BASE's object again, a
# control: its C/A is how far A against itself strays in this run. Each
# build runs on three datapaths (about 6 GB in all, 4 minutes). The
# objects must have the map layouts of the working tree's Go bindings.
# AB_FLAGS=-6 times IPv6 paths, AB_FLAGS=-tc the tc program's;
# AB_FLAGS='-paths snat' only those paths.
BASE     ?= HEAD
AB_FLAGS ?=
bench-ab: generate
	@base=$$(mktemp --suffix=.o) && trap 'rm -f '"$$base" EXIT && \
	git show $(BASE):bpf/lb_bpfel.o > "$$base" && \
	$(GO) run ./tests/bench -a "$$base" -b bpf/lb_bpfel.o,"$$base" -rounds 15 \
		-names "$(BASE) (bpf/lb_bpfel.o as committed),the working tree (make generate),$(BASE) again (the control: what A against itself reads)" $(AB_FLAGS)

# The control plane end to end (tests/benchcontrol): a real l4lbd in a
# namespace serves N services of 10 backends; one endpoint changes, 20 times
# per size and path, each timed from its event until the pinned BPF maps
# hold it, with the CPU l4lbd spent, its start-up time and RSS. BASE's l4lbd
# (default HEAD) runs in the same run as the baseline. CONTROL_PATHS picks
# what changes: file (reload), override (drain/enable), health (a TCP check
# flips), consul (a real agent, bin/consul), kubernetes (a real
# kube-apiserver and etcd, `make kube-tools`); the last two are built when
# asked for. About 10 minutes on 2 CPUs with the defaults; all five paths
# at 100,1000 for one round take 4. CONTROL_FLAGS='-services 1000 -rounds 3'.
# CONTROL_PATHS=file,override,health,consul,kubernetes.
CONTROL_FLAGS ?= -services 100,1000,10000 -rounds 2
CONTROL_PATHS ?= file,override
bench-control: build $(if $(findstring consul,$(CONTROL_PATHS)),$(CONSUL)) $(if $(findstring kubernetes,$(CONTROL_PATHS)),kube-tools)
	@base=$$(mktemp -d) && trap 'git worktree remove --force '"$$base"'/src 2>/dev/null; rm -rf '"$$base"'; git worktree prune' EXIT && \
	git worktree add --detach "$$base/src" $(BASE) >/dev/null && \
	$(GO) -C "$$base/src" build -o "$$base/l4lbd" ./cmd/l4lbd && \
	$(GO) run ./tests/benchcontrol -l4lbd "$$base/l4lbd",$(BIN)/l4lbd -names "$(BASE),working tree" -paths $(CONTROL_PATHS) -consul $(CONSUL) $(CONTROL_FLAGS)

# The datapath fuzzer (lb/datapath/fuzz_test.go): both BPF entry points on
# frames the engine mutates from the seed corpus, checked by an oracle of
# its own. Its seed corpus alone runs in `make test`. A failing input is
# written to lb/datapath/testdata/fuzz/FuzzDatapath/ and replays with
# `go test ./lb/datapath -run FuzzDatapath/NAME`.
# Minimizing is bounded by runs, not time: the engine kills a worker whose
# minimization times out, and a killed worker cannot remove its namespaces.
FUZZTIME ?= 10m
FUZZMINIMIZE ?= 2000x
fuzz: deps
	cd lb/datapath && $(GO) test -run '^$$' -fuzz '^FuzzDatapath$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) .

# The failure modes l4lb removes, side by side with a kube-proxy-shaped
# iptables setup in one run (docs/compare.md): control-plane cost of an
# endpoint change, a rolling update under load, conntrack exhaustion and
# connection latency. Root; about eight minutes on 2 CPUs. COMPARE_FLAGS="-o json" for
# machines, "-plot FILE.svg" for failed connections over time, "-fast" for
# the small counts the test runs.
COMPARE_FLAGS ?=
compare: deps-compare build
	$(GO) run ./tests/compare -l4lbd $(BIN)/l4lbd -l4lbctl $(BIN)/l4lbctl $(COMPARE_FLAGS)

# Box failure against BIRD with BFD, FAILOVER_TRIALS times each: frozen
# l4lbd, link dropping frames with carrier up, health-driven withdrawal;
# and L2 takeover between two boxes ([l2.failover]): l4lbd killed, frozen,
# cut off, stopped. Prints the MEASURE lines (median, p99, min, max);
# docs/scale-out.md. FAILOVER_RUN=TestL2Failover runs one of them.
FAILOVER_TRIALS ?= 10
FAILOVER_RUN ?= TestBFDFailover|TestL2Failover
failover: deps
	@mkdir -p $(BIN)
	@L4LB_PRIVILEGED_TESTS=1 L4LB_FAILOVER_TRIALS=$(FAILOVER_TRIALS) $(GO) test ./tests/e2e -run '$(FAILOVER_RUN)' -v $(TESTFLAGS) >$(BIN)/failover.log 2>&1; \
		rc=$$?; grep -E 'MEASURE|^(---|ok|FAIL|PASS)' $(BIN)/failover.log; echo "full log: $(BIN)/failover.log"; exit $$rc

# The units name /usr/local binaries; installing under another PREFIX
# rewrites those paths.
unit_paths = -e 's|/usr/local/sbin/|$(1)/sbin/|g' -e 's|/usr/local/bin/|$(1)/bin/|g'

install: build
	install -D -m 0755 $(BIN)/l4lbd $(DESTDIR)$(PREFIX)/sbin/l4lbd
	install -D -m 0755 $(BIN)/l4lbctl $(DESTDIR)$(PREFIX)/bin/l4lbctl
	install -d $(DESTDIR)/etc/systemd/system
	for u in l4lb.service l4lb-backend.service; do \
		sed $(call unit_paths,$(PREFIX)) systemd/$$u > $(DESTDIR)/etc/systemd/system/$$u && chmod 0644 $(DESTDIR)/etc/systemd/system/$$u; done
	@if [ -e $(DESTDIR)/etc/l4lb/l4lb.toml ]; then \
		echo "keeping existing $(DESTDIR)/etc/l4lb/l4lb.toml"; \
	else install -D -m 0640 etc/l4lb.toml $(DESTDIR)/etc/l4lb/l4lb.toml; fi
	@if [ -e $(DESTDIR)/etc/default/l4lb-backend ]; then \
		echo "keeping existing $(DESTDIR)/etc/default/l4lb-backend"; \
	else install -D -m 0644 etc/default/l4lb-backend $(DESTDIR)/etc/default/l4lb-backend; fi

# The Debian package: binaries, units with /usr paths, /etc/l4lb/l4lb.toml
# and /etc/default/l4lb-backend as conffiles, man pages generated from the
# cobra commands, bash and zsh completion, maintainer scripts that start
# nothing, remove the datapath on removal and keep it on upgrade
# (packaging/debian). nfpm runs from its own module.
# The packaged binaries are static (CGO_ENABLED=0: the package depends on
# no shared library, so it needs no Depends:), stripped (-s -w) and built
# with -trimpath; tests/packaging_test.go holds them to the size budget of
# docs/operations.md.
DEB_ARCH    ?= $(shell dpkg --print-architecture 2>/dev/null || $(GO) env GOARCH)
DEB_VERSION ?= 0.0~git$(shell git log -1 --format=%cd.%h --date=format:%Y%m%d 2>/dev/null || echo 0)
DEB         := $(BIN)/l4lb_$(DEB_VERSION)_$(DEB_ARCH).deb
deb:
	rm -rf $(BIN)/deb && mkdir -p $(BIN)/deb/man $(BIN)/deb/completion
	for c in l4lbd l4lbctl; do \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS) -s -w" -o $(BIN)/deb/$$c ./cmd/$$c || exit 1; done
	cp -r etc/l4lb.toml etc/default/l4lb-backend etc/examples LICENSE packaging/debian $(BIN)/deb/
	for u in l4lb.service l4lb-backend.service; do sed $(call unit_paths,/usr) systemd/$$u > $(BIN)/deb/$$u; done
	export SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0); \
		$(BIN)/deb/l4lbd gendoc $(BIN)/deb/man && $(BIN)/deb/l4lbctl gendoc $(BIN)/deb/man && gzip -9n $(BIN)/deb/man/*.8
	for c in l4lbd l4lbctl; do \
		$(BIN)/deb/$$c completion bash > $(BIN)/deb/completion/$$c.bash && \
		$(BIN)/deb/$$c completion zsh > $(BIN)/deb/completion/_$$c; done
	$(GO) -C packaging build -o $(abspath $(BIN))/nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm
	rm -f $(DEB)
	cd $(BIN)/deb && DEB_ARCH=$(DEB_ARCH) DEB_VERSION=$(DEB_VERSION) \
		$(abspath $(BIN))/nfpm package --packager deb --config $(abspath packaging/nfpm.yaml) --target $(abspath $(DEB))
	@echo "built $(DEB)"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/sbin/l4lbd $(DESTDIR)$(PREFIX)/bin/l4lbctl \
		$(DESTDIR)/etc/systemd/system/l4lb.service $(DESTDIR)/etc/systemd/system/l4lb-backend.service

clean:
	rm -rf $(BIN)
