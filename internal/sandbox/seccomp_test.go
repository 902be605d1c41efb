//go:build linux && (amd64 || arm64)

package sandbox

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"kpush.dev/kpush/internal/tools"
)

func TestSeccompFilterAssembles(t *testing.T) {
	start := time.Now()
	b, err := buildSeccompFilter(seccompRules)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || len(b)%8 != 0 {
		t.Fatalf("program is %d bytes, want a non-empty multiple of 8 (struct sock_filter)", len(b))
	}
	n := len(b) / 8
	if n >= bpfMaxInsns {
		t.Fatalf("program has %d instructions, the kernel takes at most %d", n, bpfMaxInsns)
	}
	t.Logf("%d rules, %d instructions (%d bytes), built in %v", len(seccompRules), n, len(b), took)

	raw := seccompDecode(t, b)
	if ins, ok := bpf.Disassemble(raw); !ok {
		t.Errorf("the program holds instructions x/net/bpf cannot decode: %v", ins)
	}
	for i, r := range raw {
		// The kernel accepts only 32-bit absolute loads in a seccomp filter.
		if r.Op&0x07 == 0x00 && r.Op != 0x20 { // BPF_LD class, but not BPF_LD|BPF_W|BPF_ABS
			t.Errorf("instruction %d: load %#x is not BPF_LD|BPF_W|BPF_ABS", i, r.Op)
		}
	}

	got, err := SeccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b) {
		t.Fatal("SeccompFilter differs from a fresh build")
	}
	got[0] ^= 0xff // callers get a copy
	if again, _ := SeccompFilter(); !bytes.Equal(again, b) {
		t.Fatal("changing SeccompFilter's result changed the cached program")
	}
	t.Run("duplicate syscall", func(t *testing.T) {
		dup := append(slices.Clone(seccompRules), seccompDeny("mount again", unix.SYS_MOUNT, "never", "test"))
		if _, err := buildSeccompFilter(dup); err == nil {
			t.Fatal("a table naming a syscall twice assembled")
		}
	})
}

// seccompMustRefuse is written independently of the deny table: the calls the default
// profile refuses a container without capabilities that the table must keep.
var seccompMustRefuse = map[string]uintptr{
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
	"chroot": unix.SYS_CHROOT, "kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE, "delete_module": unix.SYS_DELETE_MODULE,
	"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
	"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN, "reboot": unix.SYS_REBOOT,
	"swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF, "syslog": unix.SYS_SYSLOG, "acct": unix.SYS_ACCT,
	"settimeofday": unix.SYS_SETTIMEOFDAY, "clock_settime": unix.SYS_CLOCK_SETTIME, "quotactl": unix.SYS_QUOTACTL,
	"lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE, "open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
	"userfaultfd": unix.SYS_USERFAULTFD, "unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS,
	"mount_setattr": unix.SYS_MOUNT_SETATTR, "move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE,
	"fsopen": unix.SYS_FSOPEN, "fsconfig": unix.SYS_FSCONFIG, "fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK,
	"vhangup": unix.SYS_VHANGUP, "nfsservctl": unix.SYS_NFSSERVCTL, "kcmp": unix.SYS_KCMP,
	"pidfd_getfd": unix.SYS_PIDFD_GETFD, "io_uring_setup": unix.SYS_IO_URING_SETUP,
	"sethostname": unix.SYS_SETHOSTNAME, "fanotify_init": unix.SYS_FANOTIFY_INIT, "mbind": unix.SYS_MBIND,
}

// seccompMustAllow are ordinary calls, and calls the profile allows that a denylist might
// be tempted to take.
var seccompMustAllow = map[string]uintptr{
	"read": unix.SYS_READ, "write": unix.SYS_WRITE, "openat": unix.SYS_OPENAT, "close": unix.SYS_CLOSE,
	"execve": unix.SYS_EXECVE, "getpid": unix.SYS_GETPID, "mmap": unix.SYS_MMAP, "futex": unix.SYS_FUTEX,
	"exit_group": unix.SYS_EXIT_GROUP, "prctl": unix.SYS_PRCTL, "seccomp": unix.SYS_SECCOMP,
	"ptrace": unix.SYS_PTRACE, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
	"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT, "adjtimex": unix.SYS_ADJTIMEX,
	"clock_adjtime": unix.SYS_CLOCK_ADJTIME, "setuid": unix.SYS_SETUID, "capset": unix.SYS_CAPSET,
	"mknodat": unix.SYS_MKNODAT, "pidfd_open": unix.SYS_PIDFD_OPEN, "memfd_create": unix.SYS_MEMFD_CREATE,
	"file_getattr": unix.SYS_FILE_GETATTR,
}

// TestSeccompFilterDecisions runs the program in x/net/bpf's VM on seccomp_data built by
// hand. The VM loads words big-endian, so seccompData writes each 32-bit word big-endian
// where the (little-endian) kernel keeps it: the program sees the values it sees there.
func TestSeccompFilterDecisions(t *testing.T) {
	b, err := SeccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	prog, ok := bpf.Disassemble(seccompDecode(t, b))
	if !ok {
		t.Fatal("cannot disassemble the program")
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	run := func(arch, nr uint32, args ...uint64) uint32 {
		out, err := vm.Run(seccompData(arch, nr, args...))
		if err != nil {
			t.Fatalf("nr %d: %v", nr, err)
		}
		return uint32(out)
	}
	const allow = unix.SECCOMP_RET_ALLOW
	const kill = unix.SECCOMP_RET_KILL_PROCESS
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }
	native := uint32(seccompNativeArch)
	eperm := errno(unix.EPERM)

	for _, r := range seccompRules {
		if r.arg == nil {
			if got := run(native, r.nr); got != errno(r.errno) {
				t.Errorf("%s: %#x, want errno %d", r.name, got, r.errno)
			}
		}
	}
	for name, nr := range seccompMustRefuse {
		if got := run(native, uint32(nr)); got != eperm {
			t.Errorf("%s (%d): %#x, want EPERM", name, nr, got)
		}
	}
	for name, nr := range seccompMustAllow {
		if got := run(native, uint32(nr)); got != allow {
			t.Errorf("%s (%d): %#x, want allow", name, nr, got)
		}
	}

	hi := uint64(1) << 32
	cases := []struct {
		name string
		nr   uintptr
		args []uint64
		want uint32
	}{
		{"clone3", unix.SYS_CLONE3, nil, errno(unix.ENOSYS)},
		{"clone fork", unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, allow},
		{"clone thread", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID}, allow},
		{"clone vfork pidfd", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, allow},
		{"clone high word only", unix.SYS_CLONE, []uint64{0xffffffff << 32}, allow},
		{"clone NEWNS", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNS | uint64(unix.SIGCHLD)}, eperm},
		{"clone NEWUSER", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER}, eperm},
		{"clone NEWPID", unix.SYS_CLONE, []uint64{unix.CLONE_NEWPID}, eperm},
		{"clone NEWNET", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET}, eperm},
		{"clone NEWUTS", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUTS}, eperm},
		{"clone NEWIPC", unix.SYS_CLONE, []uint64{unix.CLONE_NEWIPC}, eperm},
		{"clone NEWCGROUP", unix.SYS_CLONE, []uint64{unix.CLONE_NEWCGROUP}, eperm},
		{"socket AF_INET", unix.SYS_SOCKET, []uint64{unix.AF_INET}, allow},
		{"socket AF_INET6", unix.SYS_SOCKET, []uint64{unix.AF_INET6}, allow},
		{"socket AF_UNIX", unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, allow},
		{"socket AF_NETLINK", unix.SYS_SOCKET, []uint64{unix.AF_NETLINK}, allow},
		{"socket family 39", unix.SYS_SOCKET, []uint64{unix.AF_ALG + 1}, allow},
		{"socket AF_ALG", unix.SYS_SOCKET, []uint64{unix.AF_ALG}, eperm},
		{"socket AF_VSOCK", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, eperm},
		{"socket AF_ALG high bits", unix.SYS_SOCKET, []uint64{hi | unix.AF_ALG}, eperm},
		{"personality query", unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow},
		{"personality PER_LINUX", unix.SYS_PERSONALITY, []uint64{0}, allow},
		{"personality PER_LINUX32", unix.SYS_PERSONALITY, []uint64{0x8}, allow},
		{"personality UNAME26", unix.SYS_PERSONALITY, []uint64{0x20000}, allow},
		{"personality UNAME26|PER_LINUX32", unix.SYS_PERSONALITY, []uint64{0x20008}, allow},
		{"personality ADDR_NO_RANDOMIZE", unix.SYS_PERSONALITY, []uint64{0x0040000}, eperm},
		{"personality READ_IMPLIES_EXEC", unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm},
		{"personality MMAP_PAGE_ZERO", unix.SYS_PERSONALITY, []uint64{0x0100000}, eperm},
		{"personality high bits", unix.SYS_PERSONALITY, []uint64{hi | 0x0040000}, eperm},
		{"ioctl TCGETS", unix.SYS_IOCTL, []uint64{0, unix.TCGETS}, allow},
		{"ioctl TIOCGWINSZ", unix.SYS_IOCTL, []uint64{0, unix.TIOCGWINSZ}, allow},
		{"ioctl fd 0x5412", unix.SYS_IOCTL, []uint64{unix.TIOCSTI, unix.TCGETS}, allow},
		{"ioctl TIOCSTI", unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, eperm},
		{"ioctl TIOCLINUX", unix.SYS_IOCTL, []uint64{0, unix.TIOCLINUX}, eperm},
		{"ioctl TIOCSTI high bits", unix.SYS_IOCTL, []uint64{0, hi | unix.TIOCSTI}, eperm},
		{"nr -1 (tracer skip)", ^uintptr(0), nil, allow},
		{"unknown syscall number", 0x3fff, nil, allow},
	}
	for _, c := range cases {
		if got := run(native, uint32(c.nr), c.args...); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}

	for _, arch := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_AARCH64, 0} {
		if arch == native {
			continue
		}
		if got := run(arch, uint32(unix.SYS_GETPID)); got != kill {
			t.Errorf("getpid from arch %#x: %#x, want kill", arch, got)
		}
	}
	if seccompX32Bit != 0 {
		for _, nr := range []uint32{39, 165 /* x32 mount */, 512} {
			if got := run(native, seccompX32Bit|nr); got != kill {
				t.Errorf("x32 call %d: %#x, want kill", nr, got)
			}
		}
	}
}

// seccompData is struct seccomp_data as the program sees it (see TestSeccompFilterDecisions).
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[seccompDataNr:], nr)
	binary.BigEndian.PutUint32(b[seccompDataArch:], arch)
	for i, a := range args {
		off := seccompDataArgs + 8*i
		binary.BigEndian.PutUint32(b[off:], uint32(a))       // low word first (little-endian)
		binary.BigEndian.PutUint32(b[off+4:], uint32(a>>32)) // then the high word
	}
	return b
}

func seccompDecode(t *testing.T, b []byte) []bpf.RawInstruction {
	t.Helper()
	var raw []bpf.RawInstruction
	for ; len(b) >= 8; b = b[8:] {
		raw = append(raw, bpf.RawInstruction{
			Op: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:]),
		})
	}
	return raw
}

func seccompEncode(raw []bpf.RawInstruction) []byte {
	var b []byte
	for _, r := range raw {
		b = binary.NativeEndian.AppendUint16(b, r.Op)
		b = append(b, r.Jt, r.Jf)
		b = binary.NativeEndian.AppendUint32(b, r.K)
	}
	return b
}

// seccompMarker replaces EPERM in the marked copy of the filter: a result only the filter
// can produce, so a call the kernel would refuse with EPERM anyway (kexec_load without
// CAP_SYS_BOOT) still shows that the filter, not the kernel, refused it.
const seccompMarker = unix.EHWPOISON

// seccompMarked returns the production program with every "return EPERM" turned into
// "return seccompMarker"; nothing else changes.
func seccompMarked(t *testing.T, b []byte) []byte {
	raw := seccompDecode(t, b)
	n := 0
	for i, r := range raw {
		if r.Op == 0x06 /* BPF_RET|BPF_K */ && r.K == unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM) {
			raw[i].K = unix.SECCOMP_RET_ERRNO | uint32(seccompMarker)
			n++
		}
	}
	if n == 0 {
		t.Fatal("the filter never returns EPERM")
	}
	return seccompEncode(raw)
}

// seccompAnyResult: the call's result without the filter depends on the host's kernel
// (configuration, sysctls); the marked filter run still proves the filter refuses it.
const seccompAnyResult = unix.Errno(1 << 20)

// seccompAttempts are what the probe tries, in order, and what must happen:
// refused is what the filter returns (0: the filter lets the call through), open the result
// without the filter for root with every capability in its own user namespace, ordinary
// that it must succeed in every run.
var seccompAttempts = []struct {
	name     string
	refused  unix.Errno
	open     unix.Errno
	ordinary bool
}{
	{"getpid", 0, 0, true},
	{"file write+read", 0, 0, true},
	{"socket AF_INET", 0, 0, true},
	{"execve /bin/true", 0, 0, true},
	{"personality query", 0, 0, true},
	{"personality PER_LINUX32", 0, 0, true},
	{"mount tmpfs", unix.EPERM, 0, false},
	{"umount2", unix.EPERM, 0, false},
	{"pivot_root", unix.EPERM, unix.ENOENT, false}, // paths that do not exist
	{"chroot", unix.EPERM, 0, false},
	{"fsopen tmpfs", unix.EPERM, 0, false},
	{"open_by_handle_at", unix.EPERM, seccompAnyResult, false},
	{"keyctl", unix.EPERM, 0, false},
	{"kexec_load", unix.EPERM, seccompAnyResult, false},  // EPERM, or ENOSYS without CONFIG_KEXEC
	{"init_module", unix.EPERM, seccompAnyResult, false}, // EPERM, or ENOSYS without CONFIG_MODULES
	{"bpf", unix.EPERM, seccompAnyResult, false},
	{"perf_event_open", unix.EPERM, seccompAnyResult, false},
	{"userfaultfd", unix.EPERM, seccompAnyResult, false},
	{"io_uring_setup", unix.EPERM, seccompAnyResult, false},
	{"unshare CLONE_NEWUSER", unix.EPERM, unix.EINVAL, false}, // EINVAL: a Go process has threads
	{"setns", unix.EPERM, unix.EBADF, false},
	{"clone CLONE_NEWNS", unix.EPERM, unix.EINVAL, false},   // with CLONE_FS: the kernel's first check
	{"clone CLONE_NEWUSER", unix.EPERM, unix.EINVAL, false}, // ditto
	{"clone3", unix.ENOSYS, unix.EINVAL, false},             // size 0
	{"personality ADDR_NO_RANDOMIZE", unix.EPERM, 0, false},
	{"socket AF_ALG", unix.EPERM, seccompAnyResult, false},
	{"socket AF_ALG high bits", unix.EPERM, seccompAnyResult, false},
	{"socket AF_VSOCK", unix.EPERM, seccompAnyResult, false},
	{"tty setup", 0, 0, true},
	{"ioctl TCGETS", 0, 0, true},
	{"ioctl TIOCSTI", unix.EPERM, seccompAnyResult, false}, // 0 or EIO (dev.tty.legacy_tiocsti)
	{"ioctl TIOCSTI high bits", unix.EPERM, seccompAnyResult, false},
	{"ioctl TIOCLINUX", unix.EPERM, seccompAnyResult, false},
}

// seccompProbeSource is the probe: one line per attempt, "attempt\t<name>\t<errno>" (0 on
// success), then "status\t<field>\t<value>" from /proc/self/status. With argument "x32" it
// makes one x32 ABI call instead. Constants come from golang.org/x/sys/unix through the
// template, so the probe needs nothing but the standard library.
const seccompProbeSource = `package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"unsafe"
)

const (
{{- range $k, $v := .}}
	{{$k}} = {{$v}}
{{- end}}
)

func sys(nr uintptr, a ...uintptr) syscall.Errno {
	var v [6]uintptr
	copy(v[:], a)
	r, _, e := syscall.Syscall6(nr, v[0], v[1], v[2], v[3], v[4], v[5])
	if e == 0 && (nr == SYS_SOCKET || nr == SYS_FSOPEN || nr == SYS_USERFAULTFD) {
		syscall.Close(int(r))
	}
	return e
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if err == nil {
		return 0
	} else if errors.As(err, &e) {
		return e
	}
	fmt.Printf("error\t%v\n", err)
	return syscall.EINVAL
}

func str(s string) uintptr {
	p, err := syscall.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return uintptr(unsafe.Pointer(p))
}

// clone with flags that include CLONE_FS and a namespace flag: the kernel refuses them with
// EINVAL before it creates anything. Should a child appear anyway, it exits at once.
func clone(flags uintptr) syscall.Errno {
	r, _, e := syscall.RawSyscall6(SYS_CLONE, flags, 0, 0, 0, 0, 0)
	if e == 0 && r == 0 {
		syscall.RawSyscall(SYS_EXIT_GROUP, 0, 0, 0)
	}
	if e == 0 {
		var ws syscall.WaitStatus
		syscall.Wait4(int(r), &ws, 0, nil)
	}
	return e
}

func personality(p uintptr) syscall.Errno {
	e := sys(SYS_PERSONALITY, p)
	sys(SYS_PERSONALITY, 0)
	return e
}

var tty int = -1

func ttySetup() syscall.Errno {
	m, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return errnoOf(err)
	}
	var unlock, n int32
	if e := sys(SYS_IOCTL, uintptr(m), TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		return e
	}
	if e := sys(SYS_IOCTL, uintptr(m), TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		return e
	}
	if _, err := syscall.Setsid(); err != nil {
		return errnoOf(err)
	}
	s, err := syscall.Open(fmt.Sprintf("/dev/pts/%d", n), syscall.O_RDWR, 0)
	if err != nil {
		return errnoOf(err)
	}
	if e := sys(SYS_IOCTL, uintptr(s), TIOCSCTTY, 0); e != 0 {
		return e
	}
	tty = s
	return 0
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "x32" {
		_, _, e := syscall.RawSyscall(X32_GETPID, 0, 0, 0)
		fmt.Printf("attempt\tx32 getpid\t%d\n", uintptr(e))
		return
	}
	var termios [64]byte
	c := byte('x')
	attempts := []struct {
		name string
		f    func() syscall.Errno
	}{
		{"getpid", func() syscall.Errno {
			if syscall.Getpid() <= 0 {
				return syscall.EINVAL
			}
			return 0
		}},
		{"file write+read", func() syscall.Errno {
			if err := os.WriteFile("/tmp/probe-file", []byte("kpush"), 0o600); err != nil {
				return errnoOf(err)
			}
			b, err := os.ReadFile("/tmp/probe-file")
			if err == nil && string(b) != "kpush" {
				return syscall.EIO
			}
			return errnoOf(err)
		}},
		{"socket AF_INET", func() syscall.Errno { return sys(SYS_SOCKET, AF_INET, SOCK_STREAM, 0) }},
		{"execve /bin/true", func() syscall.Errno { return errnoOf(exec.Command("/bin/true").Run()) }},
		{"personality query", func() syscall.Errno { return sys(SYS_PERSONALITY, 0xffffffff) }},
		{"personality PER_LINUX32", func() syscall.Errno { return personality(0x0008) }},
		{"mount tmpfs", func() syscall.Errno {
			os.MkdirAll("/tmp/probe-mnt", 0o755)
			return sys(SYS_MOUNT, str("probe"), str("/tmp/probe-mnt"), str("tmpfs"), 0, 0)
		}},
		{"umount2", func() syscall.Errno { return sys(SYS_UMOUNT2, str("/tmp/probe-mnt"), 0) }},
		{"pivot_root", func() syscall.Errno { return sys(SYS_PIVOT_ROOT, str("/tmp/no-such-root"), str("/tmp/no-such-root")) }},
		{"chroot", func() syscall.Errno { return sys(SYS_CHROOT, str("/")) }},
		{"fsopen tmpfs", func() syscall.Errno { return sys(SYS_FSOPEN, str("tmpfs"), 0) }},
		{"open_by_handle_at", func() syscall.Errno { return sys(SYS_OPEN_BY_HANDLE_AT, AT_FDCWD, 0, 0) }},
		{"keyctl", func() syscall.Errno {
			return sys(SYS_KEYCTL, KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING, 1)
		}},
		{"kexec_load", func() syscall.Errno { return sys(SYS_KEXEC_LOAD, 0, 0, 0, 0) }},
		{"init_module", func() syscall.Errno { return sys(SYS_INIT_MODULE, 0, 0, str("")) }},
		{"bpf", func() syscall.Errno { return sys(SYS_BPF, 0, 0, 0) }},
		{"perf_event_open", func() syscall.Errno { return sys(SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0) }},
		{"userfaultfd", func() syscall.Errno { return sys(SYS_USERFAULTFD, O_CLOEXEC) }},
		{"io_uring_setup", func() syscall.Errno { return sys(SYS_IO_URING_SETUP, 1, 0) }},
		{"unshare CLONE_NEWUSER", func() syscall.Errno { return sys(SYS_UNSHARE, CLONE_NEWUSER) }},
		{"setns", func() syscall.Errno { return sys(SYS_SETNS, ^uintptr(0), 0) }},
		{"clone CLONE_NEWNS", func() syscall.Errno { return clone(CLONE_NEWNS | CLONE_FS | SIGCHLD) }},
		{"clone CLONE_NEWUSER", func() syscall.Errno { return clone(CLONE_NEWUSER | CLONE_FS | SIGCHLD) }},
		{"clone3", func() syscall.Errno { return sys(SYS_CLONE3, 0, 0) }},
		{"personality ADDR_NO_RANDOMIZE", func() syscall.Errno { return personality(ADDR_NO_RANDOMIZE) }},
		{"socket AF_ALG", func() syscall.Errno { return sys(SYS_SOCKET, AF_ALG, SOCK_SEQPACKET, 0) }},
		{"socket AF_ALG high bits", func() syscall.Errno { return sys(SYS_SOCKET, 1<<32|AF_ALG, SOCK_SEQPACKET, 0) }},
		{"socket AF_VSOCK", func() syscall.Errno { return sys(SYS_SOCKET, AF_VSOCK, SOCK_STREAM, 0) }},
		{"tty setup", ttySetup},
		{"ioctl TCGETS", func() syscall.Errno { return sys(SYS_IOCTL, uintptr(tty), TCGETS, uintptr(unsafe.Pointer(&termios))) }},
		{"ioctl TIOCSTI", func() syscall.Errno { return sys(SYS_IOCTL, uintptr(tty), TIOCSTI, uintptr(unsafe.Pointer(&c))) }},
		{"ioctl TIOCSTI high bits", func() syscall.Errno {
			return sys(SYS_IOCTL, uintptr(tty), 1<<32|TIOCSTI, uintptr(unsafe.Pointer(&c)))
		}},
		{"ioctl TIOCLINUX", func() syscall.Errno { return sys(SYS_IOCTL, uintptr(tty), TIOCLINUX, uintptr(unsafe.Pointer(&c))) }},
	}
	for _, a := range attempts {
		fmt.Printf("attempt\t%s\t%d\n", a.name, uintptr(a.f()))
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Seccomp", "NoNewPrivs", "CapEff", "Uid":
			fmt.Printf("status\t%s\t%s\n", k, strings.Join(strings.Fields(v), " "))
		}
	}
}
`

// seccompProbeConsts are the template's constants.
func seccompProbeConsts() map[string]string {
	c := map[string]uint64{
		"SYS_SOCKET": unix.SYS_SOCKET, "SYS_FSOPEN": unix.SYS_FSOPEN, "SYS_USERFAULTFD": unix.SYS_USERFAULTFD,
		"SYS_CLONE": unix.SYS_CLONE, "SYS_CLONE3": unix.SYS_CLONE3, "SYS_EXIT_GROUP": unix.SYS_EXIT_GROUP,
		"SYS_PERSONALITY": unix.SYS_PERSONALITY, "SYS_IOCTL": unix.SYS_IOCTL, "SYS_MOUNT": unix.SYS_MOUNT,
		"SYS_UMOUNT2": unix.SYS_UMOUNT2, "SYS_PIVOT_ROOT": unix.SYS_PIVOT_ROOT, "SYS_CHROOT": unix.SYS_CHROOT,
		"SYS_OPEN_BY_HANDLE_AT": unix.SYS_OPEN_BY_HANDLE_AT, "SYS_KEYCTL": unix.SYS_KEYCTL,
		"SYS_KEXEC_LOAD": unix.SYS_KEXEC_LOAD, "SYS_INIT_MODULE": unix.SYS_INIT_MODULE, "SYS_BPF": unix.SYS_BPF,
		"SYS_PERF_EVENT_OPEN": unix.SYS_PERF_EVENT_OPEN, "SYS_IO_URING_SETUP": unix.SYS_IO_URING_SETUP,
		"SYS_UNSHARE": unix.SYS_UNSHARE, "SYS_SETNS": unix.SYS_SETNS,
		"AF_INET": unix.AF_INET, "AF_ALG": unix.AF_ALG, "AF_VSOCK": unix.AF_VSOCK,
		"SOCK_STREAM": unix.SOCK_STREAM, "SOCK_SEQPACKET": unix.SOCK_SEQPACKET,
		"CLONE_NEWNS": unix.CLONE_NEWNS, "CLONE_NEWUSER": unix.CLONE_NEWUSER, "CLONE_FS": unix.CLONE_FS,
		"SIGCHLD": uint64(unix.SIGCHLD), "O_CLOEXEC": unix.O_CLOEXEC, "ADDR_NO_RANDOMIZE": 0x0040000,
		"KEYCTL_GET_KEYRING_ID": unix.KEYCTL_GET_KEYRING_ID,
		"TIOCSPTLCK":            unix.TIOCSPTLCK, "TIOCGPTN": unix.TIOCGPTN, "TIOCSCTTY": unix.TIOCSCTTY,
		"TCGETS": unix.TCGETS, "TIOCSTI": unix.TIOCSTI, "TIOCLINUX": unix.TIOCLINUX,
		// x32's getpid: 39 with __X32_SYSCALL_BIT (only built into the probe on amd64)
		"X32_GETPID": 0x40000000 | 39,
	}
	out := map[string]string{}
	for k, v := range c {
		out[k] = fmt.Sprintf("%#x", v)
	}
	// Negative ones, as the uintptr the kernel sees.
	out["AT_FDCWD"] = "^uintptr(99)"                // -100
	out["KEY_SPEC_PROCESS_KEYRING"] = "^uintptr(1)" // -2
	return out
}

// seccompBuild compiles a static Go program from source for goarch into dir.
func seccompBuild(t *testing.T, dir, name, source, goarch string) string {
	t.Helper()
	src := filepath.Join(dir, name+".go")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=", "GOWORK=off", "GO111MODULE=on")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, out)
	}
	return bin
}

// seccompProbe writes and builds the probe into a new directory.
func seccompProbe(t *testing.T) (dir string) {
	t.Helper()
	var src bytes.Buffer
	if err := template.Must(template.New("probe").Parse(seccompProbeSource)).Execute(&src, seccompProbeConsts()); err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	seccompBuild(t, dir, "probe", src.String(), runtime.GOARCH)
	return dir
}

// seccompRun runs argv (dir is bound at /tmp/kpush-probe) in a bwrap sandbox: privileged is
// uid 0 with every capability in its own user namespace (where mount, chroot, keyctl
// succeed), else uid 1000 without capabilities (a kpush sandbox). filter nil: no --seccomp.
func seccompRun(t *testing.T, dir string, privileged bool, filter []byte, argv ...string) (stdout, stderr string, exit int) {
	t.Helper()
	bwrap, err := tools.Path("bwrap")
	if err != nil {
		t.Fatalf("%v (run make tools)", err)
	}
	args := []string{
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
		"--ro-bind", dir, "/tmp/kpush-probe", "--unshare-user", "--unshare-pid", "--die-with-parent",
	}
	if privileged {
		args = append(args, "--uid", "0", "--gid", "0", "--cap-add", "ALL")
	} else {
		args = append(args, "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL")
	}
	cmd := exec.Command(bwrap)
	if filter != nil {
		f, err := os.CreateTemp(t.TempDir(), "filter")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(filter); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		cmd.ExtraFiles = []*os.File{f} // fd 3
		args = append(args, "--seccomp", "3")
	}
	cmd.Args = append(append(append(cmd.Args, args...), "--"), argv...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		exit = ee.ExitCode()
	default:
		t.Fatalf("bwrap: %v", err)
	}
	return o.String(), e.String(), exit
}

type seccompProbeResult struct {
	errno  map[string]unix.Errno
	status map[string]string
}

func seccompParse(t *testing.T, out string) seccompProbeResult {
	t.Helper()
	r := seccompProbeResult{errno: map[string]unix.Errno{}, status: map[string]string{}}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		switch {
		case len(f) == 3 && f[0] == "attempt":
			n, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				t.Fatalf("probe line %q: %v", sc.Text(), err)
			}
			r.errno[f[1]] = unix.Errno(n)
		case len(f) == 3 && f[0] == "status":
			r.status[f[1]] = f[2]
		default:
			t.Fatalf("probe line %q", sc.Text())
		}
	}
	return r
}

func seccompErr(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	if e == seccompAnyResult {
		return "any"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("errno %d", uintptr(e))
}

// TestSeccompSandbox runs the probe under the real bwrap four times: without a filter and
// with every capability (the calls work, or fail for the kernel's own reasons); with the
// marked filter (every refused call returns the marker, so the filter refused it, and every
// other call does exactly what it did without the filter); with the real filter; and with
// the real filter as an unprivileged uid, as kpush runs sandboxes.
func TestSeccompSandbox(t *testing.T) {
	dir := seccompProbe(t)
	filter, err := SeccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	probe := func(t *testing.T, privileged bool, filter []byte) seccompProbeResult {
		t.Helper()
		out, errOut, exit := seccompRun(t, dir, privileged, filter, "/tmp/kpush-probe/probe")
		if exit != 0 {
			t.Fatalf("probe exit %d\nstdout:\n%s\nstderr:\n%s", exit, out, errOut)
		}
		r := seccompParse(t, out)
		for _, a := range seccompAttempts {
			if _, ok := r.errno[a.name]; !ok {
				t.Fatalf("probe did not report %q:\n%s%s", a.name, out, errOut)
			}
		}
		var lines []string
		for _, a := range seccompAttempts {
			lines = append(lines, fmt.Sprintf("%-30s %s", a.name, seccompErr(r.errno[a.name])))
		}
		t.Logf("probe (privileged %v, filter %v):\n%s\nstatus %v", privileged, filter != nil, strings.Join(lines, "\n"), r.status)
		return r
	}

	open := probe(t, true, nil)
	t.Run("unfiltered", func(t *testing.T) {
		if open.status["Seccomp"] != "0" {
			t.Errorf("Seccomp %q without --seccomp, want 0", open.status["Seccomp"])
		}
		for _, a := range seccompAttempts {
			if a.open != seccompAnyResult && open.errno[a.name] != a.open {
				t.Errorf("%s: %s without the filter, want %s", a.name, seccompErr(open.errno[a.name]), seccompErr(a.open))
			}
			if a.refused != 0 && open.errno[a.name] == seccompMarker {
				t.Errorf("%s: the kernel returns the marker errno itself; pick another marker", a.name)
			}
		}
	})

	check := func(t *testing.T, got seccompProbeResult, eperm unix.Errno, compare bool) {
		t.Helper()
		if got.status["Seccomp"] != "2" || got.status["NoNewPrivs"] != "1" {
			t.Errorf("status %v, want Seccomp 2 (filter) and NoNewPrivs 1", got.status)
		}
		for _, a := range seccompAttempts {
			g := got.errno[a.name]
			switch {
			case a.refused == unix.EPERM && g != eperm, a.refused != 0 && a.refused != unix.EPERM && g != a.refused:
				want := a.refused
				if want == unix.EPERM {
					want = eperm
				}
				t.Errorf("%s: %s, want %s from the filter", a.name, seccompErr(g), seccompErr(want))
			case a.refused == 0 && compare && g != open.errno[a.name]:
				t.Errorf("%s: %s under the filter, %s without: the filter must let it through", a.name, seccompErr(g), seccompErr(open.errno[a.name]))
			case a.ordinary && g != 0:
				t.Errorf("%s: %s, want success", a.name, seccompErr(g))
			}
		}
	}
	t.Run("marked filter", func(t *testing.T) {
		check(t, probe(t, true, seccompMarked(t, filter)), seccompMarker, true)
	})
	t.Run("filter", func(t *testing.T) {
		check(t, probe(t, true, filter), unix.EPERM, true)
	})
	t.Run("filter unprivileged", func(t *testing.T) {
		r := probe(t, false, filter)
		check(t, r, unix.EPERM, false)
		if r.status["CapEff"] != "0000000000000000" {
			t.Errorf("CapEff %q, want none", r.status["CapEff"])
		}
	})
}

// TestSeccompForeignABI: calls through another ABI than the native one kill the process
// under the filter (a denylist cannot judge their syscall numbers), and work without it.
func TestSeccompForeignABI(t *testing.T) {
	dir := seccompProbe(t)
	filter, err := SeccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	const sigsys = 128 + int(syscall.SIGSYS) // bwrap's exit status for a command killed by SIGSYS

	t.Run("x32", func(t *testing.T) {
		if runtime.GOARCH != "amd64" {
			t.Skip("x32 is an amd64 ABI")
		}
		out, errOut, exit := seccompRun(t, dir, false, nil, "/tmp/kpush-probe/probe", "x32")
		if exit != 0 || !strings.HasPrefix(out, "attempt\tx32 getpid\t") {
			t.Fatalf("without the filter: exit %d\n%s%s", exit, out, errOut)
		}
		t.Logf("without the filter: %s", strings.TrimSpace(out)) // ENOSYS unless the kernel has CONFIG_X86_X32_ABI
		out, errOut, exit = seccompRun(t, dir, false, filter, "/tmp/kpush-probe/probe", "x32")
		if exit != sigsys || out != "" {
			t.Fatalf("with the filter: exit %d, want %d (SIGSYS)\n%s%s", exit, sigsys, out, errOut)
		}
	})

	t.Run("32-bit binary", func(t *testing.T) {
		goarch := map[string]string{"amd64": "386", "arm64": "arm"}[runtime.GOARCH]
		sub := t.TempDir()
		seccompBuild(t, sub, "hello", "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello\\n\") }\n", goarch)
		out, errOut, exit := seccompRun(t, sub, false, nil, "/tmp/kpush-probe/hello")
		if exit != 0 || out != "hello\n" {
			if strings.Contains(errOut, "xec format error") {
				t.Skipf("this kernel does not run %s binaries: %s", goarch, errOut)
			}
			t.Fatalf("%s binary without the filter: exit %d\n%s%s", goarch, exit, out, errOut)
		}
		out, errOut, exit = seccompRun(t, sub, false, filter, "/tmp/kpush-probe/hello")
		if exit != sigsys || out != "" {
			t.Fatalf("%s binary under the filter: exit %d, want %d (SIGSYS)\n%s%s", goarch, exit, sigsys, out, errOut)
		}
	})
}
