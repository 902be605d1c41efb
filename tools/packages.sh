#!/usr/bin/env bash
# Installs the Debian packages kpush runs beside itself that cannot be unpacked into the tools
# cache like bwrap (they link shared libraries of their own): slirp4netns, the user-mode
# network stack of app and build sandboxes (libslirp, GLib), and iproute2, whose `ip` the
# end-to-end tests use to make test hosts in network namespaces of their own. Needs root
# (apt-get); a no-op when they are installed.
set -euo pipefail
missing=()
for p in slirp4netns:slirp4netns ip:iproute2; do
	command -v "${p%%:*}" >/dev/null 2>&1 || missing+=("${p#*:}")
done
((${#missing[@]})) || exit 0
echo "tools: installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
	{ apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
