#!/usr/bin/env bash
# Builds the tool binaries kpush runs beside itself and tests with (CNB lifecycle + launcher,
# distribution's registry, kube-apiserver, etcd, helm, ko, Knative Serving's controller and
# webhook) from the Go module proxy, and bubblewrap + busybox from
# Debian's packages, into a cache directory keyed by the tools' go.mod/go.sum and this script.
# A warm cache costs a hash and a symlink. Prints the tools directory on its last line.
#
# Usage: tools/build.sh [LINK]   (LINK, default .tools, becomes a symlink to the cache dir)
# KPUSH_TOOLS_ONLY="lifecycle launcher …" builds just those (what `kpush dev` needs, say); the
# rest follow on the next full run, which skips what is already there.
set -euo pipefail
only=${KPUSH_TOOLS_ONLY:-}
want() { [[ -z $only || " $only " == *" $1 "* ]]; }
here=$(cd "$(dirname "$0")" && pwd)
link=${1:-$here/../.tools}
cache_root=${KPUSH_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kpush/tools}
key=$(cat "$here"/build.sh "$here"/*/go.mod "$here"/*/go.sum | sha256sum | cut -c1-16)
dir=$cache_root/$key
bin=$dir/bin

if [[ ! -f $dir/.complete ]]; then
	mkdir -p "$bin"
	export CGO_ENABLED=0 GOFLAGS=-mod=mod
	build() { # build NAME MODULE-DIR PACKAGE [LDFLAGS]
		local name=$1 mod=$2 pkg=$3 ldflags=${4:-}
		want "$name" || return 0
		[[ -x $bin/$name ]] && return 0
		echo "tools: building $name ($pkg)" >&2
		local t0=$SECONDS
		go build -C "$here/$mod" -trimpath -ldflags "-s -w $ldflags" -o "$bin/$name.tmp" "$pkg"
		mv "$bin/$name.tmp" "$bin/$name"
		echo "tools: $name built in $((SECONDS - t0)) s" >&2
	}
	lc=github.com/buildpacks/lifecycle
	build lifecycle lifecycle $lc/cmd/lifecycle "-X $lc/cmd.Version=0.20.4"
	build launcher lifecycle $lc/cmd/launcher "-X $lc/cmd.Version=0.20.4"
	build registry registry github.com/distribution/distribution/v3/cmd/registry
	build etcd etcd go.etcd.io/etcd/server/v3
	kv=""
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		kv+=" -X $p.gitVersion=v1.36.5 -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean"
	done
	build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$kv"
	build helm helm helm.sh/helm/v3/cmd/helm
	build ko ko github.com/google/ko
	build knative-controller knative knative.dev/serving/cmd/controller
	build knative-webhook knative knative.dev/serving/cmd/webhook

	# Debian packages, unpacked without installing (no root needed for this part).
	deb() { # deb PACKAGE FILE-IN-PACKAGE NAME
		local pkg=$1 path=$2 name=$3
		want "$name" || return 0
		[[ -x $bin/$name ]] && return 0
		local tmp; tmp=$(mktemp -d)
		if ! (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1); then
			echo "tools: apt-get download $pkg failed; refreshing package lists" >&2
			apt-get update -qq >&2
			(cd "$tmp" && apt-get download "$pkg" >&2)
		fi
		dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
		cp "$tmp/root/$path" "$bin/$name"
		rm -rf "$tmp"
		echo "tools: $name unpacked from Debian package $pkg" >&2
	}
	deb bubblewrap usr/bin/bwrap bwrap
	deb busybox-static bin/busybox busybox
	deb openssl usr/bin/openssl openssl # the chart's NOTES fingerprint command; links libssl3, which OpenSSH brings
	[[ -n $only ]] || touch "$dir/.complete"
fi
ln -sfn "$dir" "$link"
echo "$dir"
