package knativetest_test

import (
	"net"
	"os"
	"testing"

	"kpush.dev/kpush/deployer/knativetest"
)

// TestInPrivateNetwork checks the inner side: a fresh PID namespace (this test binary is its
// init), only the loopback interface, and loopback usable for a listener and a connection.
func TestInPrivateNetwork(t *testing.T) {
	if !knativetest.InPrivateNetwork(t) {
		return
	}
	if pid := os.Getpid(); pid != 1 {
		t.Errorf("pid = %d inside, want 1 (init of a private PID namespace)", pid)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
		t.Fatalf("interfaces = %+v, want only lo, up", ifs)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening on loopback: %v", err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("connecting over loopback: %v", err)
	}
	c.Close()
}
