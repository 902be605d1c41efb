// Package test holds kpush's end-to-end tests: the real kpush binary, the real git client
// over the system OpenSSH client, the real CNB lifecycle, a real registry and, for cluster
// mode, a real kube-apiserver.
package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kpush.dev/kpush/internal/tools"
)

// kpushBin is the kpush binary built once for all tests.
var kpushBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kpush-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kpushBin = filepath.Join(dir, "kpush")
	build := exec.Command("go", "build", "-o", kpushBin, "../cmd/kpush")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kpush:", err)
		os.Exit(1)
	}
	// Every kpush the tests start serves its ops endpoints on a free loopback port unless a
	// test says otherwise: serve's default ":8081" would collide between processes.
	if _, ok := os.LookupEnv("KPUSH_OPS_ADDR"); !ok {
		os.Setenv("KPUSH_OPS_ADDR", "127.0.0.1:0")
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireTools fails the test when `make tools` has not been run.
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := tools.Path(n); err != nil {
			t.Fatal(err)
		}
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// sshKey makes an ed25519 key pair and returns the private key's path (the public key is
// path + ".pub").
func sshKey(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return path
}

// server is a running kpush process.
type server struct {
	cmd     *exec.Cmd
	sshAddr string
	logPath string
	args    []string      // what kpush was started with (restart)
	key     string        // private key of an admin, when the test made one (sshCmd)
	exited  chan struct{} // closed when the process has exited
	stopped bool
}

// start runs kpush with args, writing its log to a file that is printed when the test
// fails, and waits until sshAddr accepts connections.
func start(t *testing.T, sshAddr string, args ...string) *server {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "kpush.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kpushBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	s := &server{cmd: cmd, sshAddr: sshAddr, logPath: logPath, args: args, exited: exited}
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		s.stop(t, exited)
		if b, err := os.ReadFile(logPath); err == nil {
			checkNoRoot(t, string(b))
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kpush log:\n%s", b)
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("kpush exited before listening on %s:\n%s", sshAddr, b)
		default:
		}
		if c, err := net.Dial("tcp", sshAddr); err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("kpush did not listen on %s within 2m", sshAddr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *server) stop(t *testing.T, exited chan struct{}) {
	if s.stopped {
		return
	}
	s.stopped = true
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Errorf("kpush did not stop within 30s of SIGTERM; killing it")
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// gitEnv returns the environment for git commands that reach kpush with key.
func gitEnv(key string) []string {
	return append(os.Environ(),
		"GIT_SSH_COMMAND=ssh -i "+key+" -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
		"GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.com",
		"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.com",
		"GIT_TERMINAL_PROMPT=0",
	)
}

// git runs git in dir and fails the test on error.
func git(t *testing.T, env []string, dir string, args ...string) string {
	t.Helper()
	out, err := gitResult(env, dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

func gitResult(env []string, dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// push runs `git push` in dir and returns its combined output as it was read line by line,
// and its exit code.
func push(t *testing.T, env []string, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"push"}, args...)...)
	cmd.Dir, cmd.Env = dir, env
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
		}
		close(done)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// workTree copies the sample app dir into a fresh git work tree with one commit.
func workTree(t *testing.T, env []string, app string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), app)
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "apps", app))); err != nil {
		t.Fatal(err)
	}
	git(t, env, dir, "init", "-q", "--initial-branch=main")
	git(t, env, dir, "add", "-A")
	git(t, env, dir, "commit", "-q", "-m", "first")
	return dir
}

// commitFile writes body to name in the work tree and commits it.
func commitFile(t *testing.T, env []string, dir, name, body, msg string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, env, dir, "commit", "-q", "-am", msg)
	return git(t, env, dir, "rev-parse", "HEAD")
}

// get fetches url through the router at routerAddr (so "APP.localhost" names need no
// resolver) and returns the status code and body.
func get(t *testing.T, routerAddr, url string) (int, string) {
	t.Helper()
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, routerAddr)
		}},
	}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// printedURL returns the first http(s) URL kpush printed on a "remote:" line.
func printedURL(t *testing.T, out string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "remote:"))
		if strings.HasPrefix(line, "remote:") && len(f) == 1 && strings.HasPrefix(f[0], "http") {
			return f[0]
		}
	}
	t.Fatalf("no URL printed:\n%s", out)
	return ""
}

// mustContain fails unless out has every line fragment in want.
func mustContain(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// restart stops kpush (SIGTERM, as an operator would) and starts it again with the same
// arguments: the same data dir and ports.
func (s *server) restart(t *testing.T) *server {
	t.Helper()
	s.stop(t, s.exited)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		l, err := net.Listen("tcp", s.sshAddr)
		if err == nil {
			l.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still taken 10s after kpush stopped: %v", s.sshAddr, err)
		}
	}
	n := start(t, s.sshAddr, s.args...)
	n.key = s.key
	return n
}

// sshResult is what one `ssh git@host COMMAND` run printed and its exit status.
type sshResult struct {
	stdout, stderr string
	code           int
}

// sshCmd runs the system OpenSSH client with key against kpush: `ssh -p PORT git@127.0.0.1
// args...`, with stdin as its input, and returns what it printed and its exit status.
func sshCmd(t *testing.T, s *server, key, stdin string, args ...string) sshResult {
	t.Helper()
	return sshRun(t, s, key, stdin, nil, args...)
}

// sshRun is sshCmd with extra ssh options (e.g. -tt) before the destination.
func sshRun(t *testing.T, s *server, key, stdin string, flags []string, args ...string) sshResult {
	t.Helper()
	host, port, err := net.SplitHostPort(s.sshAddr)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"-p", port, "-i", key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"}, flags...)
	cmd := exec.Command("ssh", append(append(argv, "git@"+host), args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ssh %s: %v", strings.Join(args, " "), err)
	}
	return sshResult{stdout.String(), stderr.String(), code}
}

// addUser registers a new user name with a fresh ed25519 key (users:add, then keys:add of the
// key named "laptop" by the server's admin) and returns the private key's path.
func addUser(t *testing.T, s *server, name string) string {
	t.Helper()
	key := sshKey(t, t.TempDir(), name)
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	kpushOK(t, s, "users:add", name)
	if r := sshCmd(t, s, s.key, string(pub), "keys:add", "laptop", "--user", name); r.code != 0 {
		t.Fatalf("keys:add for %s: %+v", name, r)
	}
	return key
}

// kpushOK runs an SSH command as the server's admin and fails the test unless it exits 0;
// it returns stdout.
func kpushOK(t *testing.T, s *server, args ...string) string {
	t.Helper()
	r := sshCmd(t, s, s.key, "", args...)
	if r.code != 0 {
		t.Fatalf("ssh … %s exited %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// kpushJSON runs an SSH command as the server's admin and decodes its stdout into v (a
// pointer; what it pointed at is zeroed first, so maps are not merged into).
func kpushJSON(t *testing.T, s *server, v any, args ...string) {
	t.Helper()
	out := kpushOK(t, s, args...)
	reflect.ValueOf(v).Elem().SetZero()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("ssh … %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// checkNoRoot fails the test when kpush's log says an app or a build ran as root: every app
// process runs as its image user on host ids of its own (internal/sandbox), whatever the
// data dir's layout (the tests', under a 0700 t.TempDir, is the README's ~/.kpush under /root).
func checkNoRoot(t *testing.T, log string) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "as root") {
			t.Errorf("kpush log says something runs as root: %s", line)
		}
		if !strings.Contains(line, "app process started") && !strings.Contains(line, "build started") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "host_uid="); ok {
				if n, err := strconv.ParseUint(v, 10, 32); err != nil || n < 1_000_000_000 {
					t.Errorf("kpush log shows a sandbox on host uid %s, not one of kpush's unprivileged ranges: %s", v, line)
				}
			}
		}
	}
}
