#!/usr/bin/env bash
# Install what a fresh Debian 12 machine with Go lacks, idempotently, and
# mount bpffs where the machine has not. Shared by `make deps`, `make demo`,
# `make compare` and .ci/run, so that the quick start and CI agree on what
# they need.
#
#   scripts/deps.sh demo     what `make demo` runs: ip, ethtool, nsenter, bpffs
#   scripts/deps.sh compare  what `make compare` runs: the demo's tools, and
#                            iptables (iptables-nft) and conntrack for its baseline
#   scripts/deps.sh test     everything `make test` needs (the default)
#
# As root, missing Debian packages are installed with apt-get; otherwise the
# script names them and exits non-zero.
set -euo pipefail

profile=${1:-test}
# Runtime tools of the topology the demo and the end-to-end tests build.
demo=(iproute2 ethtool util-linux)
# The baseline of `make compare` and its test: Debian's iptables (the
# nf_tables backend is its default) and conntrack-tools.
compare=("${demo[@]}" iptables conntrack)
case "$profile" in
demo) pkgs=("${demo[@]}") ;;
compare) pkgs=("${compare[@]}") ;;
test)
	# clang/llvm/libbpf: make generate and its check; gcc: the multiarch
	# include path; systemd: systemd-analyze for the unit tests; bird2:
	# the BGP router of the scale-out tests (they run their own bird in a
	# namespace; Debian's bird.service, which the package enables, runs a
	# config that announces nothing); nfdump: nfcapd, the IPFIX collector
	# of the flow-export test (in a namespace of its own; the nfdump.service
	# the package enables collects on the host), and nfdump to read it.
	pkgs=("${compare[@]}" clang-19 llvm-19 libbpf-dev systemd make gcc git ca-certificates bird2 nfdump) ;;
*)
	echo "usage: $0 [demo|compare|test]" >&2
	exit 2 ;;
esac

need=()
for pkg in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing Debian packages: ${need[*]}" >&2
		echo "deps: run as root (sudo make deps), or: sudo apt-get install ${need[*]}" >&2
		exit 1
	fi
	echo "deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Wait for a dpkg lock another apt run holds rather than failing.
	apt-get -o DPkg::Lock::Timeout=300 update -qq
	apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}"
fi

# bpffs is where the datapath pins its maps; systemd mounts it at boot, a
# container or a chroot may not have.
if ! mountpoint -q /sys/fs/bpf; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: /sys/fs/bpf is not a bpffs mount; as root: mount -t bpf bpf /sys/fs/bpf" >&2
		exit 1
	fi
	echo "deps: mounting bpffs on /sys/fs/bpf"
	mount -t bpf bpf /sys/fs/bpf
fi
