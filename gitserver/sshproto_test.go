package gitserver

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/gitserver/access"
)

// dialSSH logs in as the owner of the private key file key with the x/crypto client and
// returns the client and the host key the server showed.
func dialSSH(t *testing.T, ts *testServer, key string) (*gossh.Client, gossh.PublicKey) {
	t.Helper()
	pem, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	var hostKey gossh.PublicKey
	c, err := gossh.Dial("tcp", "127.0.0.1:"+ts.port, &gossh.ClientConfig{
		User: "git",
		Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, k gossh.PublicKey) error {
			hostKey = k
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, hostKey
}

// TestForwardingRefusedPTYGranted: forwarding of every kind is refused with a reason; a PTY
// request is granted (and ignored, see TestCommandWithPTY) so that `ssh -t` works.
func TestForwardingRefusedPTYGranted(t *testing.T) {
	ts := startServer(t, &recorder{})
	c, _ := dialSSH(t, ts, ts.aliceKey)

	if _, err := c.Dial("tcp", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "port forwarding is not supported") {
		t.Errorf("local port forwarding: err = %v, want a refusal saying why", err)
	}
	if l, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
		l.Close()
		t.Error("reverse port forwarding was accepted")
	}

	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []string{"auth-agent-req@openssh.com", "x11-req"} {
		if ok, err := sess.SendRequest(req, true, nil); ok || err != nil {
			t.Errorf("%s: ok=%v err=%v, want refused", req, ok, err)
		}
	}
	if err := sess.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
		t.Errorf("pty request refused: %v", err)
	}
	// The session works after all that: a git command gets its answer.
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	err = sess.Run("git-upload-pack 'nope'")
	if ee, ok := err.(*gossh.ExitError); !ok || ee.ExitStatus() != 1 || !strings.Contains(stderr.String(), "app nope does not exist") {
		t.Errorf("upload-pack after refusals: err %v, stderr %q", err, stderr.String())
	}
}

func TestHostKeyStableAcrossRestart(t *testing.T) {
	needTool(t, "ssh-keygen", "openssh-client")
	priv, pub := sshKey(t, "alice")
	keys := filepath.Join(t.TempDir(), "authorized_keys")
	os.WriteFile(keys, []byte(pub+"\n"), 0o600)
	dataDir := t.TempDir()

	var seen []string
	for range 2 {
		ts := serveDir(t, dataDir, &recorder{}, priv, WithAuthorizedKeys(keys))
		c, hk := dialSSH(t, ts, priv)
		c.Close()
		seen = append(seen, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(hk))))
		ctx, cancel := context.WithTimeout(context.Background(), 10e9)
		if err := ts.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if seen[0] != seen[1] || !strings.HasPrefix(seen[0], "ssh-ed25519 ") {
		t.Errorf("host keys across restart: %q, want the same ed25519 key", seen)
	}
	path := filepath.Join(dataDir, HostKeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("host key mode %v, want 0600", fi.Mode().Perm())
	}
	// OpenSSH reads the file: ssh-keygen -y prints its public half.
	out, err := exec.Command("ssh-keygen", "-y", "-f", path).Output()
	if err != nil {
		t.Fatalf("ssh-keygen -y: %v", err)
	}
	if f := strings.Fields(string(out)); len(f) < 2 || f[0]+" "+f[1] != seen[0] {
		t.Errorf("ssh-keygen -y = %q, want %q", out, seen[0])
	}
}

func TestEnsureRepoConcurrentFirstPushes(t *testing.T) {
	needTool(t, "git", "git")
	s, err := New(&recorder{}, WithDataDir(t.TempDir()), WithAuthorizedKeys("/nonexistent"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	dirs := make([]string, 8)
	errs := make([]error, 8)
	for i := range dirs {
		wg.Go(func() {
			dirs[i], errs[i] = s.ensureRepo(context.Background(), "race", slog.New(slog.DiscardHandler))
		})
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != s.repoDir("race") {
			t.Errorf("ensureRepo #%d = %q, %v", i, dirs[i], errs[i])
		}
	}
	ents, _ := os.ReadDir(s.reposDir)
	if len(ents) != 1 || ents[0].Name() != "race.git" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("repos dir holds %q, want only race.git (no leftover temporary directories)", names)
	}
	if got := serverGit(t, s.repoDir("race"), "symbolic-ref", "HEAD"); got != "refs/heads/main" {
		t.Errorf("new repository HEAD = %q, want refs/heads/main", got)
	}
}

func TestRunHookErrors(t *testing.T) {
	ts := startServer(t, &recorder{})
	ts.startHookServer()
	for _, tc := range []struct {
		name, hook string
		env        []string
		want       string
	}{
		{"unknown hook", "post-receive", nil, `unknown hook "post-receive"`},
		{"run by hand", "pre-receive", nil, "KPUSH_HOOK_URL"},
		{"not loopback", "pre-receive", []string{envHookURL + "=http://example.com", envPushID + "=x", envHookToken + "=y"}, "loopback"},
		{"unknown push", "pre-receive", []string{envHookURL + "=" + ts.hookURL, envPushID + "=x", envHookToken + "=y"}, "refused the hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := RunHook(context.Background(), tc.hook, strings.NewReader(""), &stdout, &stderr, tc.env)
			if code != 1 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("RunHook = %d, stderr %q; want 1 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	needTool(t, "git", "git")
	dir := t.TempDir()
	auth := AuthenticatorFunc(func(context.Context, gossh.PublicKey) (string, error) { return "x", nil })
	for _, tc := range []struct {
		name string
		h    Handler
		opts []Option
		want string
	}{
		{"nil handler", nil, []Option{WithDataDir(dir), WithAuthenticator(auth)}, "nil Handler"},
		{"no data dir", &recorder{}, []Option{WithAuthenticator(auth)}, "WithDataDir"},
		{"no auth", &recorder{}, []Option{WithDataDir(dir)}, "nobody could log in"},
		{"both auths", &recorder{}, []Option{WithDataDir(dir), WithAuthenticator(auth), WithAuthorizedKeys("k")}, "exclude each other"},
		{"access and keys", &recorder{}, []Option{WithDataDir(dir), WithAccess(&access.Store{}), WithAuthorizedKeys("k")}, "WithAccess excludes"},
		{"nil access", &recorder{}, []Option{WithDataDir(dir), WithAccess(nil)}, "nil Access"},
		{"nil command handler", &recorder{}, []Option{WithDataDir(dir), WithAuthenticator(auth), WithCommandHandler(nil)}, "nil CommandHandler"},
		{"bad size", &recorder{}, []Option{WithDataDir(dir), WithAuthenticator(auth), WithMaxPushSize(0)}, "positive"},
		{"relative hook", &recorder{}, []Option{WithDataDir(dir), WithAuthenticator(auth), WithHookCommand("kpush", "hook")}, "absolute"},
	} {
		if _, err := New(tc.h, tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	// A custom hook command and push size land in the hook script and the repositories.
	s, err := New(&recorder{}, WithDataDir(dir), WithAuthenticator(auth),
		WithHookCommand("/opt/it's here/kpush", "hook", "pre-receive"), WithMaxPushSize(12345))
	if err != nil {
		t.Fatal(err)
	}
	script, _ := os.ReadFile(filepath.Join(dir, "hooks", "pre-receive"))
	if !strings.Contains(string(script), `exec '/opt/it'\''s here/kpush' 'hook' 'pre-receive' "$@"`) {
		t.Errorf("hook script:\n%s", script)
	}
	repo, err := s.ensureRepo(context.Background(), "sized", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := serverGit(t, repo, "config", "receive.maxInputSize"); got != "12345" {
		t.Errorf("receive.maxInputSize = %q, want 12345", got)
	}
}
