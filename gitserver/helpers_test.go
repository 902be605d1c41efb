package gitserver

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// needTool fails the test (never skips) when a program the tests run is missing.
func needTool(t testing.TB, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s not found in $PATH: install it (apt-get install %s)", name, pkg)
	}
}

// sshKey makes an ed25519 key pair with ssh-keygen and returns the private key's path and the
// public key's authorized_keys line.
func sshKey(t testing.TB, comment string) (priv, pub string) {
	t.Helper()
	needTool(t, "ssh-keygen", "openssh-client")
	priv = filepath.Join(t.TempDir(), "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", priv).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	p, err := os.ReadFile(priv + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return priv, strings.TrimSpace(string(p))
}

// testServer is a Server serving on 127.0.0.1 with a user "alice" whose key is aliceKey.
type testServer struct {
	*Server
	dataDir  string
	port     string
	aliceKey string // private key path
}

func startServer(t testing.TB, h Handler, opts ...Option) *testServer {
	t.Helper()
	needTool(t, "git", "git")
	needTool(t, "ssh", "openssh-client")
	priv, pub := sshKey(t, "alice")
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	if err := os.WriteFile(keys, []byte(pub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return serveDir(t, t.TempDir(), h, priv, append([]Option{WithAuthorizedKeys(keys)}, opts...)...)
}

func serveDir(t testing.TB, dataDir string, h Handler, key string, opts ...Option) *testServer {
	t.Helper()
	level := slog.LevelDebug
	if _, ok := t.(*testing.B); ok {
		level = slog.LevelWarn // log output must not weigh on the timings
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
	srv, err := New(h, append([]Option{WithDataDir(dataDir), WithLogger(log)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return &testServer{Server: srv, dataDir: dataDir, port: port, aliceKey: key}
}

// sshArgs are the ssh options every test client uses: the given key only, no config, no
// known_hosts.
func (ts *testServer) sshArgs(key string) []string {
	return []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-p", ts.port}
}

// git is a git client logging in as the owner of key.
type gitClient struct {
	t   testing.TB
	env []string
}

func (ts *testServer) git(t testing.TB, key string) *gitClient {
	return &gitClient{t: t, env: append(os.Environ(),
		"GIT_SSH_COMMAND=ssh "+strings.Join(ts.sshArgs(key), " "),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
	)}
}

func (ts *testServer) scpURL(app string) string { return "git@127.0.0.1:" + app }
func (ts *testServer) sshURL(app string) string { return "ssh://git@127.0.0.1:" + ts.port + "/" + app }

func (g *gitClient) cmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = g.env
	return cmd
}

// run runs git in dir and returns its stdout, stderr and error.
func (g *gitClient) run(dir string, args ...string) (string, string, error) {
	cmd := g.cmd(dir, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// must runs git in dir and returns its trimmed stdout; failing fails the test.
func (g *gitClient) must(dir string, args ...string) string {
	g.t.Helper()
	out, errOut, err := g.run(dir, args...)
	if err != nil {
		g.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return strings.TrimSpace(out)
}

// newRepo makes a work tree with one commit on main and returns its directory.
func (g *gitClient) newRepo() string {
	g.t.Helper()
	dir := g.t.TempDir()
	g.must(dir, "init", "-q", "-b", "main")
	g.commit(dir, "hello.txt", "hello\n")
	return dir
}

// commit writes file and commits it; it returns the new commit's ID.
func (g *gitClient) commit(dir, file, content string) string {
	g.t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
		g.t.Fatal(err)
	}
	g.must(dir, "add", file)
	g.must(dir, "commit", "-q", "-m", "change "+file)
	return g.must(dir, "rev-parse", "HEAD")
}

// serverGit runs git on a repository of the server, outside any quarantine.
func serverGit(t *testing.T, gitDir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir=" + gitDir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// repoEntries lists the data dir's repos directory.
func repoEntries(t *testing.T, dataDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dataDir, "repos"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
