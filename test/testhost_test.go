package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// testHosts counts the test hosts made by this process (each gets its own /30).
var testHosts atomic.Int32

// listenOnTestHost returns a TCP listener on a host of the test's own: a network namespace
// the test makes, joined to the host's by a veth pair, with an address of TEST-NET-2
// (198.51.100.0/24). Builds reach it the way they reach a package registry — through their
// outbound network, which never reaches the host's loopback — so a test server that builds
// must call (the gate) lives there rather than on 127.0.0.1. The namespace and the link are
// removed when the test ends.
func listenOnTestHost(t *testing.T) net.Listener {
	t.Helper()
	n := testHosts.Add(1)
	if n > 60 {
		t.Fatal("too many test hosts")
	}
	name := fmt.Sprintf("kpush-t%d-%d", os.Getpid(), n)
	hostIf, nsIf := fmt.Sprintf("kph%d-%d", os.Getpid()%10000, n), fmt.Sprintf("kpn%d-%d", os.Getpid()%10000, n)
	hostIP, nsIP := fmt.Sprintf("198.51.100.%d", 4*n+1), fmt.Sprintf("198.51.100.%d", 4*n+2)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ip("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	ip("link", "set", nsIf, "netns", name)
	ip("addr", "add", hostIP+"/30", "dev", hostIf)
	ip("link", "set", hostIf, "up")
	ip("-n", name, "addr", "add", nsIP+"/30", "dev", nsIf)
	ip("-n", name, "link", "set", nsIf, "up")
	ip("-n", name, "link", "set", "lo", "up")

	ns, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result)
	go func() {
		// setns changes only this thread; the listener keeps the namespace it was made in.
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
		}
		if err != nil {
			ch <- result{nil, err}
			return // the thread dies with the goroutine, still locked
		}
		l, err := net.Listen("tcp", nsIP+":0")
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		self.Close()
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.l
}
