#!/usr/bin/env bash
# fuzz.sh [PACKAGE...]: run every native Go fuzz target (func FuzzXxx) of kpush, or of the
# given packages (default ./...), for a bounded time each, one after the other.
#
#   KPUSH_FUZZTIME          time per target (go test -fuzztime; default 10s)
#   KPUSH_FUZZMINIMIZETIME  time to minimize an input (default 5s): the fuzzer also minimizes
#                           every new interesting input, and that time counts against
#                           KPUSH_FUZZTIME
#   KPUSH_FUZZKEEPGOING=1   run every target even after a failure, and fail at the end
#
# `go test -fuzz` runs one target of one package per invocation, so each target is its own
# run. The first failure stops the script (unless KPUSH_FUZZKEEPGOING), names the failing input go test wrote to
# <pkg>/testdata/fuzz/<Target>/ and prints the command that reruns it. The seed corpus of every
# target (f.Add and the committed testdata/fuzz files) also runs in the ordinary `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
fuzztime=${KPUSH_FUZZTIME:-10s}
minimizetime=${KPUSH_FUZZMINIMIZETIME:-5s}
[ $# -gt 0 ] || set -- ./...

# Only packages with a Fuzz function are listed: `go test -list` runs each test binary, and
# some TestMains build kpush or start servers before they list anything. One `go test -list`
# for them all prints each package's targets, then "ok <package>".
mapfile -t dirs < <(
	grep -rlE --include='*_test.go' '^func Fuzz[A-Z0-9_]' $($GO list -f '{{.Dir}}' "$@") 2>/dev/null |
		xargs -r -n1 dirname | sort -u
)
if [ ${#dirs[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets in $*"
	exit 0
fi
runs=() # "package target"
names=()
while read -r first pkg _; do
	case $first in
	Fuzz*) names+=("$first") ;;
	ok)
		for t in "${names[@]}"; do runs+=("$pkg $t"); done
		names=()
		;;
	*)
		echo "fuzz: go test -list failed: $first $pkg" >&2
		exit 1
		;;
	esac
done < <($GO test -run '^$' -list '^Fuzz' "${dirs[@]}")

start=$SECONDS
n=0
failed=()
for run in "${runs[@]}"; do
	pkg=${run% *} target=${run#* }
	t0=$SECONDS
	echo "fuzz: $pkg $target for $fuzztime"
	log=$(mktemp)
	if $GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" \
		"$pkg" >"$log" 2>&1; then
		echo "fuzz:   $(grep -E '^fuzz: elapsed: .*execs' "$log" | tail -n 1 | grep -oE 'execs: [0-9]+') in $((SECONDS - t0))s"
		rm -f "$log"
		n=$((n + 1))
		continue
	fi
	input=$(sed -n "s|.*Failing input written to testdata/fuzz/$target/||p" "$log" | head -n 1)
	# Go's fuzz coordinator (before Go 1.27) can report its own -fuzztime deadline as a failure,
	# with no failing input: go.dev/issue/75804. That is the end of the run, not a finding.
	if [ -z "$input" ] && grep -qx '    context deadline exceeded' "$log" && ! grep -q -- '--- FAIL: .*/' "$log"; then
		echo "fuzz:   stopped at the deadline (go.dev/issue/75804, no failing input) after $((SECONDS - t0))s"
		rm -f "$log"
		n=$((n + 1))
		continue
	fi
	grep -vE '^fuzz: elapsed' "$log" | tail -n 40
	rm -f "$log"
	echo
	echo "fuzz: $target in $pkg FAILED after $((SECONDS - start))s."
	if [ -n "$input" ]; then
		dir=$($GO list -f '{{.Dir}}' "$pkg")
		echo "fuzz: the failing input is ${dir#"$PWD"/}/testdata/fuzz/$target/$input; rerun it with:"
		echo "  $GO test -run '^$target/$input\$' $pkg"
		echo "fuzz: once fixed, keep that file: the ordinary go test runs it from then on."
	else
		echo "fuzz: rerun with: $GO test -run '^$' -fuzz '^$target\$' -fuzztime $fuzztime $pkg"
	fi
	[ "${KPUSH_FUZZKEEPGOING:-}" = 1 ] || exit 1
	failed+=("$pkg $target")
done
echo "fuzz: $n of ${#runs[@]} targets passed in $((SECONDS - start))s ($fuzztime each)"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED: %s\n' "${failed[@]}"
	exit 1
fi
