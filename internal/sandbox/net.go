package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"kpush.dev/kpush/internal/tools"
)

// slirp4netnsPath finds slirp4netns (Debian's package, which `make tools` installs).
func slirp4netnsPath() (string, error) {
	p, err := tools.Path("slirp4netns")
	if err != nil {
		return "", fmt.Errorf("slirp4netns is not installed: it gives sandboxes outbound network without the host's loopback; run `make tools` (or apt-get install slirp4netns)")
	}
	return p, nil
}

// waitLoopbackUp waits until lo is up in the network namespace netns: bubblewrap sets up
// loopback in a new namespace (address, then up) while kpush reads its PID. It fails when
// done (the sandbox's exit) closes first, or after 10 s.
func waitLoopbackUp(netns *os.File, done <-chan struct{}) error {
	// One thread enters the namespace once and polls there.
	return inNetns(netns, func() error {
		deadline := time.Now().Add(10 * time.Second)
		for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
			if lo, err := net.InterfaceByName("lo"); err == nil && lo.Flags&net.FlagUp != 0 {
				return nil
			}
			select {
			case <-done:
				return errors.New("bubblewrap exited while setting up the network namespace")
			case <-time.After(delay):
			}
			if time.Now().After(deadline) {
				return errors.New("the sandbox's loopback interface was not up within 10s")
			}
		}
	})
}

// startSlirp attaches slirp4netns to the network namespace netns (owned by the user
// namespace userns) and waits until the namespace's tap0 is configured: 10.0.2.100/24,
// gateway 10.0.2.2, DNS 10.0.2.3. It runs as the sandbox's own unprivileged host uid and gid
// (joining the sandbox's user namespace only to set up the tap device), with its seccomp
// filter, and refuses connections to the host's loopback (--disable-host-loopback), so the
// sandbox reaches what the host reaches except the host's 127.0.0.1 services. done is the
// sandbox's exit.
func startSlirp(bin string, netns, userns *os.File, uid, gid uint32, done <-chan struct{}) (*slirp, error) {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer readyR.Close()
	var stderr strings.Builder
	// Descriptors: firstExtraFD netns, +1 userns, +2 the ready pipe.
	fd := func(i int) string { return strconv.Itoa(firstExtraFD + i) }
	cmd, err := launcher(plan{UID: uid, GID: gid, Tun: true}, bin, []string{"slirp4netns",
		"--configure", "--mtu=65520", "--disable-host-loopback",
		// Not --enable-sandbox: slirp4netns 1.2 then needs uid 0 in the target's user
		// namespace, and the sandbox maps only its own user.
		"--enable-seccomp",
		"--ready-fd=" + fd(2),
		"--netns-type=path", "--userns-path=/proc/self/fd/" + fd(1),
		"/proc/self/fd/" + fd(0), "tap0"}, []*os.File{netns, userns, readyW})
	if err != nil {
		readyW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err = cmd.Start()
	readyW.Close()
	for _, f := range cmd.ExtraFiles[:firstExtraFD-3] {
		f.Close() // the plan and the executable; netns and userns stay the caller's
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: starting slirp4netns: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := readyR.Read(b)
		ready <- err
	}()
	fail := func(err error) (*slirp, error) {
		_ = cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("sandbox: slirp4netns: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	select {
	case err := <-ready:
		if err != nil {
			return fail(errors.New("exited before the network was up"))
		}
	case err := <-exited:
		return nil, fmt.Errorf("sandbox: slirp4netns exited before the network was up (%v): %s", err, strings.TrimSpace(stderr.String()))
	case <-done:
		return fail(errors.New("the sandbox exited first"))
	case <-time.After(20 * time.Second):
		return fail(errors.New("the network was not up within 20s"))
	}
	return &slirp{cmd: cmd, exited: exited}, nil
}

// slirp is a running slirp4netns.
type slirp struct {
	cmd    *exec.Cmd
	exited chan error
}

// stop kills slirp4netns and waits for it.
func (s *slirp) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}
