package gitserver

import (
	"runtime"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// TestUnregisteredKeyStaysUnderHandshakeDeadline: a key that verifies but is registered to
// nobody gets its "not registered" answer, yet its connection stays counted as
// unauthenticated and is cut at the handshake deadline, however it keeps busy.
func TestUnregisteredKeyStaysUnderHandshakeDeadline(t *testing.T) {
	const timeout = 500 * time.Millisecond
	as := startAccessServer(t, HandlerFunc(nil), WithHandshakeTimeout(timeout))
	stranger, _ := keygen(t, "ed25519", 0, "stranger@elsewhere")
	c, err := gossh.Dial("tcp", as.addr(), clientConfig(t, stranger))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	closed := make(chan struct{})
	go func() { c.Wait(); close(closed) }()
	// Busy the way an attacker would be: a session every 100 ms.
	for {
		select {
		case <-closed:
			if d := time.Since(start); d > 10*timeout {
				t.Fatalf("closed after %s, want about the handshake timeout %s", d, timeout)
			}
			return
		case <-time.After(100 * time.Millisecond):
			if sess, err := c.NewSession(); err == nil {
				sess.Run("apps")
				sess.Close()
			}
		}
		if time.Since(start) > 20*timeout {
			t.Fatalf("an unregistered key's connection was still open after %s", 20*timeout)
		}
	}
}

// TestRegisteredKeyLeavesHandshakeDeadline is the other side: a registered key's quiet
// connection outlives the handshake deadline.
func TestRegisteredKeyLeavesHandshakeDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	as := startAccessServer(t, HandlerFunc(nil), WithHandshakeTimeout(timeout))
	c, err := gossh.Dial("tcp", as.addr(), clientConfig(t, as.rootKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3 * timeout) // the premise is time passing
	sess, err := c.NewSession()
	if err != nil {
		t.Fatalf("opening a session after the handshake timeout: %v", err)
	}
	sess.Close()
}

// TestWindowChangesDoNotPinSessions: sessions that ask for a pty and then resize it, again
// and again, leave no goroutine behind once closed.
func TestWindowChangesDoNotPinSessions(t *testing.T) {
	ts := startServer(t, HandlerFunc(nil), okCommand)
	c, err := gossh.Dial("tcp", ts.addr(), clientConfig(t, ts.aliceKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runOK(t, c) // everything a session starts once is started
	before := runtime.NumGoroutine()
	const sessions = 50
	for range sessions {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := sess.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			sess.WindowChange(25+i, 81)
		}
		sess.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		after := runtime.NumGoroutine()
		if after < before+sessions/2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before %d resized sessions, %d after they closed", before, sessions, after)
		}
	}
}
