package knativetest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// envPrivateNetwork marks the re-executed test binary: its value is the name of the test
// that runs inside the private network namespace.
const envPrivateNetwork = "KNATIVETEST_PRIVATE_NETWORK"

// InPrivateNetwork runs the calling test again, alone, in a private network namespace (and
// PID namespace) of its own, and tells the caller which side it is on:
//
//	func TestX(t *testing.T) {
//		if !knativetest.InPrivateNetwork(t) {
//			return // the test ran (and passed or failed) in the private network
//		}
//		// inside: only a loopback interface, 127.0.0.1 and ::1
//	}
//
// Outside, it re-executes the test binary with `unshare --net --pid --mount-proc --fork
// --kill-child` (util-linux; needs root or CAP_SYS_ADMIN; --mount-proc gives the PID namespace
// its own /proc, which bubblewrap needs), waits for it, logs its output (always on failure,
// with -v otherwise), fails t if the inner run failed, and returns false. Inside, it brings
// the loopback interface up, checks that lo is the only interface, and returns true.
//
// Processes the inner test leaves behind die with it: the inner test binary is PID 1 of its
// PID namespace, and the kernel kills every process in that namespace when it exits, after
// which the network namespace is gone too. Tests that start servers listening on all
// interfaces (StartServing) must run inside.
func InPrivateNetwork(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envPrivateNetwork) == t.Name() {
		if err := setLoopbackUp(); err != nil {
			t.Fatalf("knativetest: bringing up the loopback interface in the private network namespace: %v", err)
		}
		if err := checkPrivateNetwork(); err != nil {
			t.Fatalf("knativetest: %v", err)
		}
		return true
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("knativetest: unshare not found (apt-get install util-linux): %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("knativetest: finding the test binary: %v", err)
	}
	var run []string
	for _, part := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(part)+"$")
	}
	args := []string{"--net", "--pid", "--mount-proc", "--fork", "--kill-child", "--", exe,
		"-test.run=" + strings.Join(run, "/"), "-test.v=true", "-test.count=1"}

	ctx := context.Background()
	if dl, ok := t.Deadline(); ok {
		// End the inner run a little before go test's own timeout so its output is still logged.
		inner := time.Until(dl) - 15*time.Second
		if inner < time.Minute {
			inner = time.Until(dl)
		}
		args = append(args, "-test.timeout="+inner.String())
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, unshare, args...)
	cmd.Env = append(os.Environ(), envPrivateNetwork+"="+t.Name())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	t0 := time.Now()
	err = cmd.Run()
	if err != nil || testing.Verbose() {
		t.Logf("knativetest: output of the run in the private network namespace (%s):\n%s",
			time.Since(t0).Round(time.Millisecond), out.String())
	}
	if err != nil {
		t.Errorf("knativetest: %s in a private network namespace (unshare --net --pid --mount-proc): %v", t.Name(), err)
	}
	return false
}

// ifreqFlags is struct ifreq (linux/if.h) as SIOCGIFFLAGS/SIOCSIFFLAGS use it: the interface
// name and the flags, padded to the size of the union (24 bytes on 64-bit Linux).
type ifreqFlags struct {
	name  [syscall.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

// setLoopbackUp sets IFF_UP on "lo" (what `ip link set lo up` does) with the ioctls of
// netdevice(7); the kernel then assigns 127.0.0.1/8 and ::1.
func setLoopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening a socket for interface ioctls: %w", err)
	}
	defer syscall.Close(fd)
	var req ifreqFlags
	copy(req.name[:], "lo")
	if err := ioctl(fd, syscall.SIOCGIFFLAGS, &req); err != nil {
		return fmt.Errorf("reading the flags of lo (SIOCGIFFLAGS): %w", err)
	}
	req.flags |= syscall.IFF_UP
	if err := ioctl(fd, syscall.SIOCSIFFLAGS, &req); err != nil {
		return fmt.Errorf("setting lo up (SIOCSIFFLAGS): %w", err)
	}
	return nil
}

func ioctl(fd int, op uintptr, req *ifreqFlags) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), op, uintptr(unsafe.Pointer(req))); errno != 0 {
		return errno
	}
	return nil
}

// checkPrivateNetwork verifies that this process sees a network namespace of its own: the
// loopback interface, up, and no other interface.
func checkPrivateNetwork() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("listing network interfaces: %w", err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	if len(ifs) != 1 || ifs[0].Flags&net.FlagLoopback == 0 || ifs[0].Flags&net.FlagUp == 0 {
		return fmt.Errorf("not in a private network namespace: interfaces %v, want only lo (up); run the test through InPrivateNetwork", names)
	}
	return nil
}
