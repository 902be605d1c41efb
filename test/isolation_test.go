package test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"kpush.dev/kpush/internal/tools"
)

// probeScript checks, from inside a sandbox, that the host stays out of reach, and prints one
// line per check: "<label>: ok <check>" or "<label>: FAIL <check>". $1 is the label, $2 a
// static busybox to run the probes with, $3 kpush's data dir on the host, the rest are the
// host's loopback listeners (HOST:PORT) that must not answer.
const probeScript = `#!/bin/sh
label=$1 bb=$2 data=$3
shift 3
check() {
	name=$1
	shift
	if "$@" >/dev/null 2>&1; then echo "$label: ok $name"; else echo "$label: FAIL $name"; fi
}
check "uid is not 0" test "$($bb id -u)" != 0
for t in "$@"; do
	port=${t##*:}
	check "$t unreachable" sh -c "! $bb nc -w 2 ${t%:*} $port </dev/null"
	check "$t unreachable through the gateway" sh -c "! $bb nc -w 2 10.0.2.2 $port </dev/null"
done
check "/proc/sys read-only" sh -c '! echo "|/tmp/x" > /proc/sys/kernel/core_pattern'
check "no host process visible" sh -c 'n=0; for p in /proc/[0-9]*; do n=$((n+1)); test "${p#/proc/}" -lt 100 || exit 1; done; test $n -le 12'
check "mount denied" sh -c "! $bb mount -t tmpfs none /tmp"
check "no new user namespace" sh -c "! $bb unshare -U -r true"
check "no host /etc" sh -c 'test ! -e /etc/shadow && test ! -e /etc/ssh && test ! -e /etc/os-release && test ! -e /etc/hostname'
check "no host data dir" test ! -e "$data"
check "resolver is the sandbox's" grep -q "^nameserver 10.0.2.3" /etc/resolv.conf
echo "$label: done"
`

// TestDevAppAndBuildSandboxesKeepTheHostOut pushes a probe app whose build runs a probe
// buildpack and whose web process runs the same probe: neither reaches a service on the
// host's loopback (the registry, the ops and hook endpoints, SSH, the router, a test
// listener), runs as uid 0, writes kernel knobs, sees a host process or host files, or may
// mount or make a user namespace; and the app still answers through the router.
func TestDevAppAndBuildSandboxesKeepTheHostOut(t *testing.T) {
	bb, err := tools.Path("busybox")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()

	// The probe as a buildpack, in front of every group.
	bp := filepath.Join(t.TempDir(), "isolation-probe")
	writeFiles(t, bp, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/isolation-probe\"\nversion = \"0.0.1\"\n[[stacks]]\nid = \"*\"\n",
		"bin/detect":     "#!/bin/sh\nexit 0\n",
		"bin/probe.sh":   probeScript,
		"bin/build":      "#!/bin/sh\nexec sh \"$CNB_BUILDPACK_DIR/bin/probe.sh\" probe-build \"$CNB_BUILDPACK_DIR/bin/busybox\" $(cat \"$CNB_BUILDPACK_DIR/data\") $(cat \"$CNB_BUILDPACK_DIR/targets\")\n",
	})
	copyFile(t, bb, filepath.Join(bp, "bin", "busybox"))

	s, httpAddr, env := devServer(t, "--buildpack", bp)
	targets := append(loopbackListeners(t), l.Addr().String())
	for _, want := range []string{s.sshAddr, httpAddr, l.Addr().String()} {
		if !contains(targets, want) {
			t.Fatalf("loopback listeners %v lack %s", targets, want)
		}
	}
	if len(targets) < 6 { // + the registry, the ops and the hook endpoints
		t.Fatalf("found only %d loopback listeners: %v", len(targets), targets)
	}
	t.Logf("probing %v", targets)
	data := dataDirOf(s)
	writeFiles(t, bp, map[string]string{"targets": strings.Join(targets, " "), "data": data})

	// The probe as the app: it writes its report, then serves it.
	dir := filepath.Join(t.TempDir(), "probe")
	writeFiles(t, dir, map[string]string{
		"probe.sh": probeScript,
		"Procfile": "web: mkdir -p /tmp/www && sh probe.sh probe-run /bin/busybox " + data + " " + strings.Join(targets, " ") +
			" > /tmp/www/index.html 2>&1; exec busybox httpd -f -p $PORT -h /tmp/www\n",
	})
	git(t, env, dir, "init", "-q", "--initial-branch=main")
	git(t, env, dir, "add", "-A")
	git(t, env, dir, "commit", "-q", "-m", "probe")
	git(t, env, dir, "remote", "add", "knative", s.remote("probe"))
	out, code := push(t, env, dir, "knative", "main")
	if code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, out)
	}
	checkProbe(t, "probe-build", out, len(targets))

	code, report := get(t, httpAddr, printedURL(t, out))
	if code != 200 {
		t.Fatalf("the probe app does not answer through the router: %d %q", code, report)
	}
	checkProbe(t, "probe-run", report, len(targets))
	if n := accepted.Load(); n != 0 {
		t.Errorf("the test's loopback listener accepted %d connections from sandboxes", n)
	}
}

// checkProbe asserts that out holds label's whole report with every check ok.
func checkProbe(t *testing.T, label, out string, targets int) {
	t.Helper()
	ok, done := 0, false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(line, "remote:"))
		switch {
		case strings.HasPrefix(line, label+": FAIL "):
			t.Errorf("%s", line)
		case strings.HasPrefix(line, label+": ok "):
			ok++
		case line == label+": done":
			done = true
		}
	}
	if want := 8 + 2*targets; !done || ok != want {
		t.Errorf("%s: %d checks ok (want %d), finished %v:\n%s", label, ok, want, done, out)
	}
}

// loopbackListeners returns every TCP socket listening on 127.0.0.1 in the host's network
// namespace (/proc/net/tcp), as HOST:PORT.
func loopbackListeners(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" { // LISTEN
			continue
		}
		host, port, ok := strings.Cut(fields[1], ":")
		if !ok || host != "0100007F" { // 127.0.0.1, little-endian hex
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			continue
		}
		out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
