#!/usr/bin/env bash
# Build the kube-apiserver and etcd that the discovery/kubernetes tests run
# against, from the pinned tools modules in tests/kubetools, into a cache
# directory outside the checkout keyed by version. A binary already there is
# kept: the cold build takes about 11 minutes on 2 cores and ~3 GB of
# memory, a cached one nothing. Prints nothing else when both are present.
#
#   scripts/kube-tools.sh          build what is missing
#   scripts/kube-tools.sh --print  print the two binary paths and exit
#
# L4LB_KUBE_CACHE overrides the cache root (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/l4lb). The tests look in the same place
# (discovery/kubernetes/kubetest), or take L4LB_KUBE_APISERVER and L4LB_ETCD.
set -euo pipefail
cd "$(dirname "$0")/.."

kube_version=v1.37.2
etcd_version=v3.7.3
root=${L4LB_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/l4lb}
apiserver=$root/kube-$kube_version/kube-apiserver
etcd=$root/etcd-$etcd_version/etcd

if [ "${1:-}" = --print ]; then
	echo "$apiserver"
	echo "$etcd"
	exit 0
fi

# build OUT DIR PKG [LDFLAGS]: go build in the tools module DIR, into a
# temporary name moved into place only once complete, so that an interrupted
# build never leaves a truncated binary that later runs would take as cached.
build() {
	local out=$1 dir=$2 pkg=$3 ldflags=${4:-}
	[ -x "$out" ] && return 0
	mkdir -p "$(dirname "$out")"
	echo "kube-tools: building $pkg into $out (first time only; the apiserver takes minutes)"
	local start=$SECONDS
	(cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
	mv "$out.tmp" "$out"
	echo "kube-tools: built $(basename "$out") in $((SECONDS - start)) s"
}

# The apiserver reports this version (kubectl version, /version); without it
# it says v0.0.0 and clients refuse features gated on the server version.
v=k8s.io/component-base/version
minor=${kube_version#v1.}
minor=${minor%%.*}
build "$etcd" tests/kubetools/etcd go.etcd.io/etcd/server/v3
build "$apiserver" tests/kubetools/apiserver k8s.io/kubernetes/cmd/kube-apiserver \
	"-X $v.gitVersion=$kube_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
