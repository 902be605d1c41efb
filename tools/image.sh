#!/usr/bin/env bash
# Builds kpush's container image with ko, without Docker or a daemon, offline (the Go module
# proxy and Debian's package archive are the only network it uses):
#   1. the base image from Debian packages (git, dash, libc, CA bundle; internal/baseimage),
#      pushed as REGISTRY/kpush-base;
#   2. kpush built onto it by ko (.ko.yaml; KO_DEFAULTBASEIMAGE points ko at step 1's digest),
#      pushed as REGISTRY/kpush:TAG.
# Prints the image as REGISTRY/kpush@sha256:DIGEST on its last line.
#
# Usage: tools/image.sh   (make image)
# Environment:
#   IMAGE_REGISTRY  host:port[/path] of a running registry to push to (plain HTTP for loopback),
#                   e.g. kpush dev's. Unset: this script runs distribution's registry from
#                   .tools/bin on 127.0.0.1 with its storage in IMAGE_STORE for the duration
#                   of the build, and says how to serve that storage again.
#   IMAGE_STORE     storage of that registry (default ${XDG_CACHE_HOME:-~/.cache}/kpush/image-registry)
#   IMAGE_TAG       tag of the kpush image (default latest)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=${KPUSH_TOOLS:-$root/.tools/bin}
for t in ko registry; do
	[[ -x $bin/$t ]] || { echo "image: $bin/$t is missing: run make tools" >&2; exit 1; }
done
reg=${IMAGE_REGISTRY:-}
if [[ -z $reg ]]; then
	store=${IMAGE_STORE:-${XDG_CACHE_HOME:-$HOME/.cache}/kpush/image-registry}
	mkdir -p "$store/data"
	port=
	for _ in {1..50}; do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
	done
	[[ -n $port ]] || { echo "image: found no free port on 127.0.0.1 for the registry" >&2; exit 1; }
	cat >"$store/config.yml" <<-EOF
		version: 0.1
		log:
		  level: warn
		storage:
		  filesystem:
		    rootdirectory: $store/data
		  delete:
		    enabled: true
		http:
		  addr: 127.0.0.1:$port
	EOF
	"$bin/registry" serve "$store/config.yml" >"$store/registry.log" 2>&1 &
	regpid=$!
	trap 'kill "$regpid" 2>/dev/null; wait "$regpid" 2>/dev/null || true' EXIT
	reg=127.0.0.1:$port
	for i in {1..100}; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
		kill -0 "$regpid" 2>/dev/null || { echo "image: the registry exited; its log:" >&2; cat "$store/registry.log" >&2; exit 1; }
		[[ $i == 100 ]] && { echo "image: the registry did not listen on $reg within 10 s; log: $store/registry.log" >&2; exit 1; }
		sleep 0.1
	done
	echo "image: registry $reg, storage $store/data" >&2
fi

goarch=$(go env GOARCH)
echo "image: building the base image from Debian packages" >&2
base=$(go run ./internal/baseimage/cmd/baseimage --repo "$reg/kpush-base")
echo "image: base $base" >&2
echo "image: building kpush with ko" >&2
img=$(KO_DOCKER_REPO=$reg/kpush KO_DEFAULTBASEIMAGE=$base GOFLAGS=${GOFLAGS:-} \
	"$bin/ko" build --bare --sbom=none --platform="linux/$goarch" --tags="${IMAGE_TAG:-latest}" ./cmd/kpush)
if [[ -z ${IMAGE_REGISTRY:-} ]]; then
	echo "image: stored in $store/data; serve it again with: $bin/registry serve $store/config.yml" >&2
fi
echo "$img"
