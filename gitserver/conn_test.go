package gitserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// logBuffer collects a server's log lines (and still shows them in the test output).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the lines holding every one of words.
func (b *logBuffer) lines(words ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var found []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		all := l != ""
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			found = append(found, l)
		}
	}
	return found
}

func logTo(t *testing.T, b *logBuffer) Option {
	return WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), b), &slog.HandlerOptions{Level: slog.LevelDebug})))
}

// okCommand answers every SSH command with "ok".
var okCommand = WithCommandHandler(CommandHandlerFunc(func(_ context.Context, c *Command) int {
	fmt.Fprintln(c.Stdout, "ok")
	return 0
}))

func (ts *testServer) addr() string { return net.JoinHostPort("127.0.0.1", ts.port) }

// clientConfig logs in as the owner of the private key file key, with x/crypto's client.
func clientConfig(t *testing.T, key string) *gossh.ClientConfig {
	t.Helper()
	pem, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	return &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
}

// runOK runs a command on c and wants the okCommand's answer.
func runOK(t *testing.T, c *gossh.Client) {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatalf("opening a session: %v", err)
	}
	defer sess.Close()
	out, err := sess.Output("apps")
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("running a command: %q, %v; want \"ok\\n\"", out, err)
	}
}

// readUntilClosed reads from c until the server closes it and returns how long that took
// from start; it fails the test if c is still open after limit.
func readUntilClosed(t *testing.T, c net.Conn, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %s", limit)
	}
	return time.Since(start)
}

func TestHandshakeTimeoutClosesConnectionsThatDoNotAuthenticate(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		hello string // what the client sends, then nothing more
	}{
		{"no version line", ""},
		{"stalls in key exchange", "SSH-2.0-stalling\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, HandlerFunc(nil), WithHandshakeTimeout(timeout))
			start := time.Now()
			c, err := net.Dial("tcp", ts.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, tc.hello); err != nil {
				t.Fatal(err)
			}
			took := readUntilClosed(t, c, start, 5*time.Second)
			if took < timeout {
				t.Errorf("closed after %s, before the handshake timeout of %s", took, timeout)
			}
			t.Logf("closed after %s", took)
		})
	}
}

func TestAuthenticatedQuietConnectionOutlivesHandshakeTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	ts := startServer(t, HandlerFunc(nil), WithHandshakeTimeout(timeout), okCommand)
	c, err := gossh.Dial("tcp", ts.addr(), clientConfig(t, ts.aliceKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The premise is time passing: the connection stays quiet past the handshake timeout.
	time.Sleep(3 * timeout)
	runOK(t, c)
}

func TestUnauthenticatedConnectionsOverPerIPLimitAreClosedAtOnce(t *testing.T) {
	var log logBuffer
	ts := startServer(t, HandlerFunc(nil), okCommand, logTo(t, &log),
		WithUnauthenticatedLimits(64, 2), WithHandshakeTimeout(time.Minute))
	// Two connections that say nothing: the server sends its version line only after it let
	// one in.
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ts.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "SSH-2.0-") {
			t.Fatalf("reading the server's version line: %q, %v", line, err)
		}
		held = append(held, c)
	}
	for i := range 2 { // the second refusal within refusedLogEvery is not logged
		start := time.Now()
		c, err := net.Dial("tcp", ts.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(start.Add(5 * time.Second))
		got, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() || len(got) > 0 {
			t.Fatalf("connection %d over the per-IP limit: read %q, %v; want it closed at once", i+3, got, err)
		}
		t.Logf("connection %d closed after %s", i+3, time.Since(start))
	}
	if warns := log.lines("level=WARN", "too many unauthenticated", "limit=per_ip", "max=2", "remote_addr=127.0.0.1:"); len(warns) != 1 {
		t.Errorf("got %d Warn lines about the per-IP limit, want 1 (the second refusal held back):\n%s", len(warns), strings.Join(warns, "\n"))
	}

	for _, c := range held {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for ts.gate.waiting() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d unauthenticated connections still counted 5s after their clients closed them", ts.gate.waiting())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := gossh.Dial("tcp", ts.addr(), clientConfig(t, ts.aliceKey))
	if err != nil {
		t.Fatalf("logging in after the other connections closed: %v", err)
	}
	defer c.Close()
	runOK(t, c)
}

func TestTooManyAuthAttemptsCloseConnection(t *testing.T) {
	var log logBuffer
	ts := startServer(t, HandlerFunc(nil), logTo(t, &log), WithMaxAuthTries(3))
	// Ten keys the server does not know, offered one after the other.
	var signers []gossh.Signer
	for range 10 {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		s, err := gossh.NewSignerFromKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		signers = append(signers, s)
	}
	_, err := gossh.Dial("tcp", ts.addr(), &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signers...)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "too many authentication failures") {
		t.Errorf("dial: %v; want the server to disconnect with \"too many authentication failures\"", err)
	}
	if n := len(log.lines("refused public key")); n != 3 {
		t.Errorf("the server judged %d keys, want 3", n)
	}
}

func TestUnansweredKeepalivesCloseConnection(t *testing.T) {
	const interval, missed = 100 * time.Millisecond, 3
	var log logBuffer
	ts := startServer(t, HandlerFunc(nil), okCommand, logTo(t, &log), WithKeepalive(interval, missed))
	cfg := clientConfig(t, ts.aliceKey)
	answering, err := gossh.Dial("tcp", ts.addr(), cfg) // its Client answers every global request
	if err != nil {
		t.Fatal(err)
	}
	defer answering.Close()

	// A real x/crypto client that never reads its global requests never answers them, like
	// a client that hangs; its connection otherwise works.
	tcp, err := net.Dial("tcp", ts.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	start := time.Now()
	silent, _, _, err := gossh.NewClientConn(tcp, ts.addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- silent.Wait() }()
	select {
	case <-closed:
		if took := time.Since(start); took < interval*missed {
			t.Errorf("closed after %s, before %d keepalive intervals of %s", took, missed, interval)
		} else {
			t.Logf("closed after %s", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server kept a client that answers no keepalives connected for 10s")
	}
	if len(log.lines("stopped answering keepalives")) != 1 {
		t.Error("no log line about the unanswered keepalives")
	}
	runOK(t, answering) // connected all along, through the same keepalives
}

func TestIdleSessionIsClosedThoughItAnswersKeepalives(t *testing.T) {
	const idle = 500 * time.Millisecond
	var log logBuffer
	ts := startServer(t, HandlerFunc(nil), logTo(t, &log), WithIdleTimeout(idle), WithKeepalive(50*time.Millisecond, 3),
		WithCommandHandler(CommandHandlerFunc(func(ctx context.Context, c *Command) int {
			io.Copy(io.Discard, c.Stdin) // until the client sends EOF or goes away
			return 0
		})))
	c, err := gossh.Dial("tcp", ts.addr(), clientConfig(t, ts.aliceKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := sess.StdinPipe() // kept open, silent
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	start := time.Now()
	if err := sess.Start("wait"); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- sess.Wait() }()
	select {
	case err := <-ended:
		var exit *gossh.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("the session ended with exit status %d, want the connection closed", exit.ExitStatus())
		}
		if took := time.Since(start); took < idle {
			t.Errorf("closed after %s, before the idle timeout of %s", took, idle)
		} else {
			t.Logf("closed after %s: %v", took, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle session stayed open for 10s")
	}
	if len(log.lines("closing idle ssh connection")) != 1 {
		t.Error("no log line about the idle connection")
	}
}

// TestQuietBuildKeepsPushFromIdleTimeout: a push through git and OpenSSH whose build prints
// nothing for longer than the idle timeout goes through, keepalives and all.
func TestQuietBuildKeepsPushFromIdleTimeout(t *testing.T) {
	const idle = 2 * time.Second
	// git receive-pack sends a keepalive packet after receive.keepAlive seconds without output
	// while the pre-receive hook runs (default 5); 1 keeps this test short. The server's git
	// reads the global config of the server's environment.
	gitConfig := filepath.Join(t.TempDir(), "gitconfig")
	if err := os.WriteFile(gitConfig, []byte("[receive]\n\tkeepAlive = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_CONFIG_GLOBAL", gitConfig)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, p *Push, out io.Writer) error {
		fmt.Fprintln(out, "building")
		// The premise is time passing: a build that prints nothing for three idle timeouts.
		select {
		case <-time.After(3 * idle):
		case <-ctx.Done():
			return ctx.Err()
		}
		fmt.Fprintln(out, "built")
		return nil
	}), WithIdleTimeout(idle), WithKeepalive(200*time.Millisecond, 2)) // OpenSSH's ssh answers them throughout
	g := ts.git(t, ts.aliceKey)
	work := g.newRepo()
	_, stderr, err := g.run(work, "push", ts.scpURL("quiet"), "main")
	if err != nil || !strings.Contains(stderr, "remote: built") {
		t.Fatalf("push: %v\n%s", err, stderr)
	}
}
