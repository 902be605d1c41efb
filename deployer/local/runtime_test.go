package local

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kpush.dev/kpush/deployer"
)

// routerServer serves rt's router on a loopback listener whose port the runtime was told.
func newRuntime(t *testing.T, dataDir string, l net.Listener) *Runtime {
	t.Helper()
	needTool(t, "bwrap")
	rt, err := New(Config{
		DataDir: dataDir, RouterPort: l.Addr().(*net.TCPAddr).Port,
		StartTimeout: 20 * time.Second, StopGrace: 3 * time.Second, Keychain: testKeychain{}, Log: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rt.Router()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close(); rt.Close() })
	return rt
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// get fetches path from the router at addr with Host <app>.localhost.
func get(t *testing.T, addr, app, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = app + ".localhost"
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", path, req.Host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func wantBody(t *testing.T, addr, app, path, want string) {
	t.Helper()
	code, body := get(t, addr, app, path)
	if code != http.StatusOK || strings.TrimSpace(body) != want {
		t.Fatalf("GET %s via router: %d %q, want 200 %q", path, code, body, want)
	}
}

func appStatus(t *testing.T, rt *Runtime, app string) AppStatus {
	t.Helper()
	for _, a := range rt.Apps() {
		if a.Name == app {
			return a
		}
	}
	t.Fatalf("app %s not in Apps()", app)
	return AppStatus{}
}

func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestDeployReplaceFailRestore(t *testing.T) {
	data := t.TempDir() // 0700, like ~/.kpush under /root: no sandbox user can traverse it
	reg := startTestRegistry(t, data)
	v1 := pushAppImage(t, reg.Addr(), "demo", appImage{index: "v1", user: "1000:1000", env: []string{"FROM_IMAGE=img"}})
	v2 := pushAppImage(t, reg.Addr(), "demo", appImage{index: "v2"})
	broken := pushAppImage(t, reg.Addr(), "demo", appImage{cmd: "echo boom-from-broken-app >&2; exit 3"})

	l := listen(t)
	addr := l.Addr().String()
	rt := newRuntime(t, data, l)
	ctx := context.Background()

	// v1
	var out bytes.Buffer
	url, err := rt.Deploy(ctx, deployer.Release{App: "demo", Image: v1, Commit: strings.Repeat("a", 40),
		Pusher: "alice", Env: map[string]string{"GREETING": "hello world", "FROM_IMAGE": "release"}}, &out)
	if err != nil {
		t.Fatalf("deploy v1: %v\n%s", err, out.String())
	}
	wantURL := "http://demo.localhost:" + strings.Split(addr, ":")[1] + "/"
	if url != wantURL {
		t.Errorf("url = %q, want %q", url, wantURL)
	}
	if !strings.Contains(out.String(), wantURL) {
		t.Errorf("progress output does not name the URL:\n%s", out.String())
	}
	wantBody(t, addr, "demo", "/", "v1")
	st1 := appStatus(t, rt, "demo")
	_, envTxt := get(t, addr, "demo", "/env.txt")
	for _, want := range []string{"GREETING=hello world", "FROM_IMAGE=release", "PORT=" + itoa(st1.Port)} {
		if !strings.Contains(envTxt, want+"\n") {
			t.Errorf("app env lacks %q:\n%s", want, envTxt)
		}
	}
	if _, id := get(t, addr, "demo", "/id.txt"); !strings.Contains(id, "uid=1000") {
		t.Errorf("v1 (User 1000:1000) runs as %q, want uid=1000", id)
	}
	if !st1.Running || st1.PID == 0 || st1.Commit != strings.Repeat("a", 40) || st1.Pusher != "alice" || st1.Image != v1 {
		t.Errorf("Apps() after v1 = %+v", st1)
	}

	// v2 replaces v1; v1's process is gone.
	if _, err := rt.Deploy(ctx, deployer.Release{App: "demo", Image: v2, Env: map[string]string{"GREETING": "v2"}}, io.Discard); err != nil {
		t.Fatalf("deploy v2: %v", err)
	}
	wantBody(t, addr, "demo", "/", "v2")
	if !processGone(st1.PID) {
		t.Errorf("v1 process %d still exists after v2 went live", st1.PID)
	}
	if _, id := get(t, addr, "demo", "/id.txt"); !strings.Contains(id, "uid=0") {
		t.Errorf("v2 (no User) runs as %q, want uid=0", id)
	}
	st2 := appStatus(t, rt, "demo")

	// A broken release fails with its output; v2 keeps serving.
	_, err = rt.Deploy(ctx, deployer.Release{App: "demo", Image: broken}, io.Discard)
	if err == nil {
		t.Fatal("deploying an image that exits at once succeeded")
	}
	if !strings.Contains(err.Error(), "boom-from-broken-app") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("error lacks the app's output or exit status: %v", err)
	}
	wantBody(t, addr, "demo", "/", "v2")
	if st := appStatus(t, rt, "demo"); st.PID != st2.PID || st.Image != v2 {
		t.Errorf("after failed deploy Apps() = %+v, want pid %d image %s", st, st2.PID, v2)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "apps", "demo", "app.log")); !bytes.Contains(b, []byte("boom-from-broken-app")) {
		t.Errorf("app.log lacks the broken app's output:\n%s", b)
	}

	// Close stops everything; the router answers 503 for the known app.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if !processGone(st2.PID) {
		t.Errorf("process %d survives Close", st2.PID)
	}
	if code, _ := get(t, addr, "demo", "/"); code != http.StatusServiceUnavailable {
		t.Errorf("after Close: status %d, want 503", code)
	}
	if _, err := rt.Deploy(ctx, deployer.Release{App: "demo", Image: v2}, io.Discard); !errors.Is(err, ErrClosed) {
		t.Errorf("Deploy after Close: %v, want ErrClosed", err)
	}

	// A new runtime on the same data dir restores v2 with its env.
	l2 := listen(t)
	rt2 := newRuntime(t, data, l2)
	if code, _ := get(t, l2.Addr().String(), "demo", "/"); code != http.StatusNotFound {
		t.Errorf("before Restore: status %d, want 404", code)
	}
	if err := rt2.Restore(ctx); err != nil {
		t.Fatalf("restore: %v", err)
	}
	wantBody(t, l2.Addr().String(), "demo", "/", "v2")
	if _, envTxt := get(t, l2.Addr().String(), "demo", "/env.txt"); !strings.Contains(envTxt, "GREETING=v2\n") {
		t.Errorf("restored app env lacks GREETING=v2:\n%s", envTxt)
	}
}

func TestDeployStartTimeout(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	img := pushAppImage(t, reg.Addr(), "sleepy", appImage{cmd: "echo napping; exec /bin/busybox sleep 600"})
	l := listen(t)
	rt := newRuntime(t, data, l)
	rt.cfg.StartTimeout = 2 * time.Second
	_, err := rt.Deploy(context.Background(), deployer.Release{App: "sleepy", Image: img}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "did not listen") || !strings.Contains(err.Error(), "napping") {
		t.Fatalf("deploy of a process that never listens: %v", err)
	}
	if code, _ := get(t, l.Addr().String(), "sleepy", "/"); code != http.StatusNotFound {
		t.Errorf("never-started app: status %d, want 404", code)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// Whatever the data dir, an app runs as its image user, on host ids of the app's own range
// (never host root), with no capability, and sees no host process.
func TestDeployRunsAsTheImageUserOnUnprivilegedHostIDs(t *testing.T) {
	data := t.TempDir() // 0700
	reg := startTestRegistry(t, data)
	img := pushAppImage(t, reg.Addr(), "demo", appImage{index: "hi", user: "app"})
	l := listen(t)
	rt := newRuntime(t, data, l)
	if _, err := rt.Deploy(context.Background(), deployer.Release{App: "demo", Image: img}, io.Discard); err != nil {
		t.Fatal(err)
	}
	wantBody(t, l.Addr().String(), "demo", "/", "hi")
	if _, id := get(t, l.Addr().String(), "demo", "/id.txt"); !strings.Contains(id, "uid=1000") {
		t.Errorf("runs as %q, want the image user (uid=1000)", id)
	}
	if _, caps := get(t, l.Addr().String(), "demo", "/caps.txt"); strings.TrimSpace(caps) != "CapEff:\t0000000000000000" {
		t.Errorf("the app has capabilities %q, want none", caps)
	}
	st := appStatus(t, rt, "demo")
	ids, err := rt.ids.Get("app/demo")
	if err != nil {
		t.Fatal(err)
	}
	for pid, uid := range hostUIDs(t, st.PID) {
		if uid != ids.Host(1000) {
			t.Errorf("host process %d of the app runs as uid %d, want %d (the app's range)", pid, uid, ids.Host(1000))
		}
	}
}

// hostUIDs returns the real uid of every host process in process group pgid.
func hostUIDs(t *testing.T, pgid int) map[int]uint32 {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint32{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name(), &st) == nil {
			out[pid] = st.Uid
		}
	}
	if len(out) == 0 {
		t.Fatalf("no process in group %d", pgid)
	}
	return out
}

// TestDestroy stops the app's process, drops its route and its files, and leaves nothing for
// Restore; destroying it again is not an error.
func TestDestroy(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	img := pushAppImage(t, reg.Addr(), "demo", appImage{index: "hi"})
	l := listen(t)
	rt := newRuntime(t, data, l)
	ctx := context.Background()
	if _, err := rt.Deploy(ctx, deployer.Release{App: "demo", Image: img}, io.Discard); err != nil {
		t.Fatal(err)
	}
	wantBody(t, l.Addr().String(), "demo", "/", "hi")
	pid := appStatus(t, rt, "demo").PID
	if err := rt.Destroy(ctx, "demo"); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if !processGone(pid) {
		t.Errorf("process %d survives Destroy", pid)
	}
	if code, _ := get(t, l.Addr().String(), "demo", "/"); code != http.StatusNotFound {
		t.Errorf("after Destroy: status %d, want 404", code)
	}
	if _, err := os.Stat(filepath.Join(data, "apps", "demo")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("app dir after Destroy: %v, want it gone", err)
	}
	if len(rt.Apps()) != 0 {
		t.Errorf("Apps() after Destroy = %+v, want none", rt.Apps())
	}
	if err := rt.Destroy(ctx, "demo"); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}
