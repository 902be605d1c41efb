package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kpush.dev/kpush/internal/tools"
)

// testIDs is a range for these tests, allocated like kpush allocates an app's.
func testIDs(t testing.TB) IDRange {
	t.Helper()
	// Host-wide, like kpush's own: no other test or kpush on this host gets these ids.
	ids, err := NewRanges(t.TempDir()).Get("test/sandbox")
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (kpush runs as root)")
	}
}

// busyboxRoot makes a root filesystem holding only a static busybox and its applet links,
// inside a directory only root can search (as ~/.kpush under /root is).
func busyboxRoot(t testing.TB) string {
	t.Helper()
	bb, err := tools.Path("busybox")
	if err != nil {
		t.Skip(err)
	}
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(private, "rootfs")
	for _, d := range []string{"bin", "etc", "proc", "dev", "tmp", "www"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "id", "cat", "ls", "nc", "ip", "echo", "sleep", "test", "unshare", "mount", "httpd", "grep", "wc", "touch", "true", "seq", "head"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "www", "index.html"), []byte("inside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// sh runs script with busybox's sh in a sandbox on root and returns its output.
func sh(t *testing.T, spec Spec, script string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	spec.Argv = []string{"/bin/sh", "-c", script}
	spec.Env = append(spec.Env, "PATH=/bin")
	spec.Stdout, spec.Stderr = &out, &out
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, spec)
	return out.String(), err
}

func TestSandboxRunsAsItsOwnUnprivilegedHostUID(t *testing.T) {
	needRoot(t)
	ids := testIDs(t)
	root := busyboxRoot(t)
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Spec{
		Argv: []string{"/bin/sh", "-c", "echo uid=$(id -u) gid=$(id -g); echo ready; exec sleep 30"},
		Env:  []string{"PATH=/bin"}, Root: root, HostIDs: ids, UID: 1000, GID: 1000,
		Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Signal(syscall.SIGKILL); s.Wait() }()
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if !strings.Contains(out.String(), "uid=1000 gid=1000") {
		t.Fatalf("inside: %q, want uid=1000 gid=1000", out.String())
	}
	// On the host, every process of the sandbox runs as the range's id for 1000, never 0.
	want := strconv.FormatUint(uint64(ids.Host(1000)), 10)
	procs := processGroup(t, s.Pid())
	if len(procs) < 2 {
		t.Fatalf("process group %d has %d processes", s.Pid(), len(procs))
	}
	for pid, uids := range procs {
		for _, u := range uids {
			if u != want {
				t.Errorf("host process %d has uids %v, want all %s", pid, uids, want)
				break
			}
		}
	}
}

func TestSandboxKeepsTheHostOut(t *testing.T) {
	needRoot(t)
	ids := testIDs(t)
	root := busyboxRoot(t)
	port, accepted := hostListener(t)
	// A descriptor kpush inherited without close-on-exec must not reach the sandbox.
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	for _, network := range []Network{NetNone, NetOutbound} {
		t.Run(network.String(), func(t *testing.T) {
			cases := []struct {
				name, script string
			}{
				{"uid is not 0", `test "$(id -u)" != 0`},
				{"proc sys is read-only", `! echo '|/tmp/x' > /proc/sys/kernel/core_pattern`},
				{"sysrq-trigger is read-only", `! echo h > /proc/sysrq-trigger`},
				{"no host process is visible", `n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo "$n processes"; test "$n" -le 3`},
				{"host loopback listener unreachable", "! nc -w 2 127.0.0.1 " + port + " </dev/null"},
				{"host loopback through the gateway unreachable", "! nc -w 2 10.0.2.2 " + port + " </dev/null"},
				{"mount is denied", `! mount -t tmpfs none /tmp`},
				{"no new user namespace", `! unshare -U -r true`},
				{"no host files", `test ! -e /root && test ! -e /etc/shadow && test ! -e /home`},
				{"/dev read-only", `! touch /dev/x 2>/dev/null`},
				{"/dev/shm capped", `! head -c 70000000 /dev/zero > /dev/shm/x 2>/dev/null`},
				{"only stdio descriptors", `n=0; for f in /proc/self/fd/*; do n=$((n+1)); done; test $n -le 4`},
			}
			for _, c := range cases {
				out, err := sh(t, Spec{Root: root, HostIDs: ids, UID: 1000, GID: 1000, Network: network}, c.script)
				if err != nil {
					t.Errorf("%s: %v\n%s", c.name, err, out)
				}
			}
			select {
			case <-accepted:
				t.Fatal("the host's loopback listener accepted a connection from the sandbox")
			default:
			}
		})
	}
}

// The control run: the same probes do reach the host when nothing stands in the way, so the
// test above can fail.
func TestSandboxProbesCanFail(t *testing.T) {
	needRoot(t)
	ids := testIDs(t)
	root := busyboxRoot(t)
	port, _ := hostListener(t)
	out, err := sh(t, Spec{Root: root, HostIDs: ids, UID: 1000, GID: 1000, Network: NetHost}, "nc -w 2 127.0.0.1 "+port+" </dev/null")
	if err != nil {
		t.Fatalf("with the host's network the listener should be reachable: %v\n%s", err, out)
	}
}

func TestSandboxOutboundHasANetworkStack(t *testing.T) {
	needRoot(t)
	out, err := sh(t, Spec{Root: busyboxRoot(t), HostIDs: testIDs(t), UID: 1000, GID: 1000, Network: NetOutbound}, "ip addr show tap0; ip route")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"inet 10.0.2.100/24", "default via 10.0.2.2"} {
		if !strings.Contains(out, want) {
			t.Errorf("network of the sandbox lacks %q:\n%s", want, out)
		}
	}
}

func TestSandboxMountsOnlyWhatItIsGiven(t *testing.T) {
	needRoot(t)
	ids := testIDs(t)
	private := t.TempDir()
	rw, ro := filepath.Join(private, "rw"), filepath.Join(private, "ro")
	for _, d := range []string{rw, ro} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, int(ids.Host(1000)), int(ids.Host(1000))); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{
		Mounts: append(HostSystemMounts(),
			Mount{Source: rw, Dest: "/work/rw", Writable: true},
			Mount{Source: ro, Dest: "/work/ro"},
			Mount{Dest: "/tmp"}),
		HostIDs: ids, UID: 1000, GID: 1000,
	}
	out, err := sh(t, spec, `set -e; touch /work/rw/x; ! touch /work/ro/x 2>/dev/null; touch /tmp/y; test ! -e /etc/passwd; test ! -e /root`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(rw, "x")); err != nil {
		t.Errorf("the writable mount did not receive the file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ro, "x")); err == nil {
		t.Error("the read-only mount was written")
	}
}

func TestSandboxLimitsProcessesAndTmpfs(t *testing.T) {
	needRoot(t)
	spec := Spec{Root: busyboxRoot(t), Mounts: []Mount{{Dest: "/tmp", Size: 1 << 20}},
		// A range of its own (testIDs): the limit counts every process of the host uid.
		HostIDs: testIDs(t), UID: 1000, GID: 1000, MaxProcs: 20}
	// A fork bomb stops at MaxProcs: of 60 background sleeps most cannot start.
	out, err := sh(t, spec, `(for i in $(seq 60); do sleep 3 & done) 2>/dev/null; n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo "started $n"`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var n int
	if _, err := fmt.Sscanf(out[strings.Index(out, "started "):], "started %d", &n); err != nil || n >= 60 || n > 20 {
		t.Errorf("%d of 60 processes started with MaxProcs 20:\n%s", n, out)
	}
	// /tmp holds at most its Size.
	out, err = sh(t, spec, `! cat /bin/busybox /bin/busybox > /tmp/big 2>/dev/null`)
	if err != nil {
		t.Errorf("writing 2 busyboxes into a 1 MiB /tmp succeeded: %v\n%s", err, out)
	}
}

func TestDialContextReachesAServerInsideTheSandbox(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuffer
	s, err := Start(ctx, Spec{
		Argv: []string{"/bin/httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"},
		Env:  []string{"PATH=/bin"}, Root: busyboxRoot(t), HostIDs: testIDs(t), UID: 1000, GID: 1000,
		Network: NetOutbound, Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Signal(syscall.SIGKILL); s.Wait() }()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return s.DialContext(ctx, network, "127.0.0.1:8080")
	}}}
	var body []byte
	waitFor(t, func() bool {
		resp, err := client.Get("http://app/index.html")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == 200
	})
	if string(body) != "inside\n" {
		t.Fatalf("body %q (output %s)", body, out.String())
	}
}

func TestStartRefusesHostIDsOutsideKpushsRanges(t *testing.T) {
	for _, c := range []struct {
		name     string
		ids      IDRange
		uid, gid uint32
	}{
		{"host root", IDRange{Base: 0}, 1000, 1000},
		{"below the first range", IDRange{Base: 100000}, 0, 0},
		{"uid outside the range", IDRange{Base: FirstHostID}, RangeSize, 0},
		{"gid outside the range", IDRange{Base: FirstHostID}, 0, RangeSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Start(context.Background(), Spec{Argv: []string{"/bin/true"}, HostIDs: c.ids, UID: c.uid, GID: c.gid})
			if err == nil {
				t.Fatal("started")
			}
		})
	}
}

func TestRangesAreStableDistinctAndHostWide(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "host", "ids.json")
	dataA, dataB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{dataA, dataB} {
		os.Mkdir(d, 0o700)
	}
	subuid := filepath.Join(dir, "subuid")
	// Another user's containers own the second range.
	os.WriteFile(subuid, []byte(fmt.Sprintf("bob:%d:65536\n", FirstHostID+RangeSize)), 0o644)
	defer func(f []string) { subIDFiles = f }(subIDFiles)
	subIDFiles = []string{subuid}

	get := func(owner, key string) IDRange {
		t.Helper()
		r, err := (&Ranges{File: file, Owner: owner}).Get(key)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	appA, buildA, appB := get(dataA, "app/x"), get(dataA, "build/x"), get(dataB, "app/x")
	if appA == buildA || appA == appB || buildA == appB {
		t.Fatalf("ranges shared: app/x %d, build/x %d, the other data dir's app/x %d", appA.Base, buildA.Base, appB.Base)
	}
	for _, r := range []IDRange{appA, buildA, appB} {
		if r.Base < FirstHostID || (r.Base-FirstHostID)%RangeSize != 0 || r.Base == FirstHostID+RangeSize {
			t.Errorf("range %d is not a free one of kpush's", r.Base)
		}
	}
	if again := get(dataA, "app/x"); again != appA {
		t.Errorf("app/x again: %d, want %d", again.Base, appA.Base)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ids file: %v %v", fi, err)
	}
	// A data dir that is gone frees its ranges, which come back only after the others.
	os.RemoveAll(dataB)
	if next := get(dataA, "app/y"); next == appB || next == appA || next == buildA {
		t.Errorf("app/y got %d, a range that is in use or was freed a moment ago", next.Base)
	}
	b, _ := os.ReadFile(file)
	if strings.Contains(string(b), dataB) {
		t.Errorf("the ranges of a data dir that is gone are still recorded:\n%s", b)
	}
	// A released range (an app destroyed) is forgotten and not handed out again at once.
	if err := (&Ranges{File: file, Owner: dataA}).Release("build/x"); err != nil {
		t.Fatal(err)
	}
	if again := get(dataA, "build/x"); again == buildA {
		t.Errorf("build/x got its released range %d back at once", again.Base)
	}
	for _, bad := range []string{"", "app", "app/", "app/A", "../x", "app/a/b"} {
		if _, err := (&Ranges{File: file, Owner: dataA}).Get(bad); err == nil {
			t.Errorf("key %q accepted", bad)
		}
	}
	if _, err := (&Ranges{File: file, Owner: "relative"}).Get("app/x"); err == nil {
		t.Error("a relative owner accepted")
	}
}

func TestCheckPassesOnThisHost(t *testing.T) {
	needRoot(t)
	if err := Check(context.Background(), testIDs(t)); err != nil {
		t.Fatal(err)
	}
}

// hostListener listens on the host's 127.0.0.1 until the test ends and returns its port and
// a channel that receives once per connection it accepts.
func hostListener(t *testing.T) (port string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan struct{}, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
			c.Close()
		}
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), ch
}

// processGroup returns the real, effective, saved and filesystem uids of every host process
// in process group pgid.
func processGroup(t *testing.T, pgid int) map[int][]string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
				out[pid] = strings.Fields(rest)
			}
		}
		f.Close()
	}
	return out
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// BenchmarkSandboxStart measures what the sandbox costs an app start, side by side with what
// kpush ran before it (bubblewrap started by root with the app's rootfs, PID/IPC/UTS
// namespaces and no capabilities, on the host's network and uid): each iteration starts
// busybox httpd and waits until it answers a TCP connection.
func BenchmarkSandboxStart(b *testing.B) {
	needRoot(b)
	root := busyboxRoot(b)
	ids := testIDs(b)
	bwrap, err := tools.Path("bwrap")
	if err != nil {
		b.Skip(err)
	}
	b.Run("before=bwrap-as-root-host-network", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			l, _ := net.Listen("tcp", "127.0.0.1:0")
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			l.Close()
			cmd := exec.Command(bwrap, "--bind", root, "/", "--proc", "/proc", "--dev", "/dev",
				"--perms", "1777", "--tmpfs", "/tmp", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
				"--die-with-parent", "--clearenv", "--cap-drop", "ALL", "--",
				"/bin/httpd", "-f", "-p", "127.0.0.1:"+port, "-h", "/www")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			for {
				if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
					c.Close()
					break
				}
				time.Sleep(time.Millisecond)
			}
			b.StopTimer() // a start is measured, not a stop
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			b.StartTimer()
		}
	})
	for _, network := range []Network{NetOutbound} { // what apps run with
		b.Run("after=sandbox-network-"+network.String(), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				s, err := Start(context.Background(), Spec{
					Argv: []string{"/bin/httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"},
					Env:  []string{"PATH=/bin"}, Root: root, Mounts: []Mount{{Dest: "/tmp"}},
					HostIDs: ids, UID: 1000, GID: 1000, Network: network,
				})
				if err != nil {
					b.Fatal(err)
				}
				for {
					if c, err := s.DialContext(context.Background(), "tcp", "127.0.0.1:8080"); err == nil {
						c.Close()
						break
					}
					time.Sleep(time.Millisecond)
				}
				b.StopTimer()
				s.Signal(syscall.SIGKILL)
				s.Wait()
				b.StartTimer()
			}
		})
	}
}

// BenchmarkSandboxRun measures one short-lived sandboxed command (busybox true) per network
// kind: the fixed cost each lifecycle phase of a build pays.
func BenchmarkSandboxRun(b *testing.B) {
	needRoot(b)
	root := busyboxRoot(b)
	ids := testIDs(b)
	for _, network := range []Network{NetHost, NetNone, NetOutbound} {
		b.Run("network="+network.String(), func(b *testing.B) {
			for b.Loop() {
				if err := Run(context.Background(), Spec{Argv: []string{"/bin/true"}, Root: root,
					HostIDs: ids, UID: 1000, GID: 1000, Network: network}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestOutboundSandboxesStartSideBySide starts many outbound sandboxes at once: slirp4netns,
// which brings lo up too, must not race bubblewrap's own set-up of lo ("loopback: Failed
// RTM_NEWADDR" now and then when it did).
func TestOutboundSandboxesStartSideBySide(t *testing.T) {
	root, ids := busyboxRoot(t), testIDs(t)
	const workers, each = 16, 40
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				var out bytes.Buffer
				err := Run(context.Background(), Spec{Argv: []string{"/bin/true"}, Root: root, HostIDs: ids, UID: 1000, GID: 1000,
					Network: NetOutbound, Stdout: &out, Stderr: &out})
				if err != nil {
					errs <- fmt.Errorf("%v: %s", err, out.String())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 3 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Errorf("%d of %d sandboxes failed to start", n, workers*each)
	}
}
