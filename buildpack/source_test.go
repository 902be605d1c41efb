package buildpack

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// kpushBin builds the real kpush binary once per test process (go build's cache keeps it
// fast); build Pods run its `source fetch` and `source complete`.
var kpushBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kpush-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kpush")
	out, err := exec.Command("go", "build", "-o", bin, "kpush.dev/kpush/cmd/kpush").CombinedOutput()
	if err != nil {
		return "", &buildErr{err: err, out: string(out)}
	}
	return bin, nil
})

type buildErr struct {
	err error
	out string
}

func (e *buildErr) Error() string { return "go build ./cmd/kpush: " + e.err.Error() + "\n" + e.out }

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "kpush" {
		os.Exit(actAsKpush(os.Args[1:]))
	}
	code := m.Run()
	if bin, err := kpushBin(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

func kpush(t *testing.T) string {
	t.Helper()
	bin, err := kpushBin()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// kpushForPods returns the kpush binary build Pods run: the real one when ./cmd/kpush builds,
// else this test binary, which acts as `kpush source ...` when started as "kpush" (actAsKpush,
// the same buildpack.RunSourceFetch the command calls), so that work in progress elsewhere in
// cmd/kpush does not block these tests. TestSourceFetchCommand always needs the real one.
func kpushForPods(t *testing.T) string {
	t.Helper()
	if bin, err := kpushBin(); err == nil {
		return bin
	} else {
		t.Logf("NOTE: cmd/kpush does not build, build pods run this test binary as kpush: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// actAsKpush is `kpush source fetch|complete` for kpushForPods.
func actAsKpush(args []string) int {
	if len(args) >= 2 && args[0] == "source" && args[1] == "complete" {
		fmt.Println("build complete")
		return 0
	}
	if len(args) < 2 || args[0] != "source" || args[1] != "fetch" {
		fmt.Fprintln(os.Stderr, "kpush (test stand-in): unknown command", args)
		return 2
	}
	var o SourceFetchOptions
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	fs.StringVar(&o.URL, "url", "", "")
	fs.StringVar(&o.TokenFile, "token-file", "", "")
	fs.StringVar(&o.Dest, "dest", "/workspace", "")
	fs.StringVar(&o.Platform, "platform", "", "")
	if err := fs.Parse(args[2:]); err != nil {
		return 2
	}
	if err := RunSourceFetch(context.Background(), o, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kpush:", err)
		return 1
	}
	return 0
}

// clock is an injectable time source for token expiry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestSourceServerTokens(t *testing.T) {
	src := writeTree(t, map[string]string{"go.mod": "module x\n", "bin/run": "#!/bin/sh\n", "sub/dir/a.txt": "a"})
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	s := &SourceServer{Now: clk.Now, TTL: time.Minute}
	srv := httptest.NewServer(s)
	defer srv.Close()

	get := func(method, auth string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}

	good, err := s.Register("b1", src)
	if err != nil {
		t.Fatal(err)
	}
	expiring, _ := s.Register("b2", src)
	revoked, _ := s.Register("b3", src)
	s.Revoke(revoked)

	// The good token works exactly once and yields the tree.
	dest := t.TempDir()
	if err := FetchSource(context.Background(), nil, srv.URL, good, dest); err != nil {
		t.Fatalf("first fetch: %v", err)
	}
	for p, want := range map[string]string{"go.mod": "module x\n", "sub/dir/a.txt": "a"} {
		if b, err := os.ReadFile(filepath.Join(dest, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dest, "bin/run")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/run mode = %v, %v; want 0755", fi, err)
	}

	clk.Add(2 * time.Minute)
	for _, tc := range []struct {
		name, method, auth string
		code               int
		body               string
	}{
		{"reused", "GET", "Bearer " + good, 403, "already used"},
		{"expired", "GET", "Bearer " + expiring, 403, "expired"},
		{"revoked", "GET", "Bearer " + revoked, 403, "not valid"},
		{"wrong", "GET", "Bearer " + strings.Repeat("A", len(good)), 403, "not valid"},
		{"no token", "GET", "", 403, "Bearer"},
		{"basic auth", "GET", "Basic " + good, 403, "Bearer"},
		{"post", "POST", "Bearer " + good, 405, "only GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(tc.method, tc.auth)
			if code != tc.code || !strings.Contains(body, tc.body) {
				t.Errorf("%s: %d %q, want %d containing %q", tc.name, code, body, tc.code, tc.body)
			}
			if strings.Contains(body, good) {
				t.Errorf("response body echoes the token")
			}
		})
	}
}

func TestExtractTarRefusesEscapes(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
	}
	for _, tc := range []struct {
		name    string
		entries []entry
		ok      bool
	}{
		{"plain", []entry{{name: "a/b.txt", typ: tar.TypeReg}, {name: "l", link: "/etc/passwd", typ: tar.TypeSymlink}}, true},
		{"dotdot", []entry{{name: "../evil", typ: tar.TypeReg}}, false},
		{"dotdot inside", []entry{{name: "a/../../evil", typ: tar.TypeReg}}, false},
		{"absolute", []entry{{name: "/evil", typ: tar.TypeReg}}, false},
		{"through symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/evil", typ: tar.TypeReg}}, false},
		{"through abs symlink", []entry{{name: "l", link: "/tmp", typ: tar.TypeSymlink}, {name: "l/evil", typ: tar.TypeReg}}, false},
		{"hard link", []entry{{name: "h", link: "/etc/passwd", typ: tar.TypeLink}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tc.entries {
				h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644}
				if e.typ == tar.TypeReg {
					h.Size = 1
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if e.typ == tar.TypeReg {
					tw.Write([]byte("x"))
				}
			}
			tw.Close()
			parent := t.TempDir()
			dest := filepath.Join(parent, "dest")
			os.Mkdir(dest, 0o755)
			err := ExtractTar(&buf, dest)
			if tc.ok && err != nil {
				t.Fatalf("extract: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("extract succeeded, want refusal")
			}
			if _, err := os.Lstat(filepath.Join(parent, "evil")); err == nil {
				t.Errorf("an entry escaped the destination")
			}
			if _, err := os.Lstat("/tmp/evil"); err == nil {
				t.Errorf("an entry escaped to /tmp/evil")
			}
		})
	}
}

// TestSourceFetchCommand runs the real `kpush source fetch` against a SourceServer on
// 127.0.0.1: the first fetch extracts the tree and writes the platform env; the same token
// again is refused with the server's reason and a non-zero exit.
func TestSourceFetchCommand(t *testing.T) {
	bin := kpush(t)
	s := &SourceServer{}
	srv := httptest.NewServer(s)
	defer srv.Close()
	src := writeTree(t, map[string]string{"Procfile": "web: x\n"})
	token, err := s.Register("b", src)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	dest, platform := filepath.Join(t.TempDir(), "ws"), t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"source", "fetch"}, args...)...)
		cmd.Env = []string{PlatformEnvEnv + `={"GOFLAGS":"-tags=x"}`}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("--url="+srv.URL, "--token-file="+tokenFile, "--dest="+dest, "--platform="+platform)
	if err != nil {
		t.Fatalf("fetch: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "Procfile")); string(b) != "web: x\n" {
		t.Errorf("Procfile = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(platform, "env", "GOFLAGS")); string(b) != "-tags=x" {
		t.Errorf("platform env GOFLAGS = %q", b)
	}
	out, err = run("--url="+srv.URL, "--token-file="+tokenFile, "--dest="+t.TempDir())
	if err == nil || !strings.Contains(out, "403") || !strings.Contains(out, "already used") {
		t.Errorf("reused token: err %v, output %q; want exit 1 with 403 already used", err, out)
	}
	out, err = run("--url="+srv.URL, "--dest="+t.TempDir())
	if err == nil || !strings.Contains(out, SourceTokenEnv) {
		t.Errorf("no token: err %v, output %q", err, out)
	}
}
