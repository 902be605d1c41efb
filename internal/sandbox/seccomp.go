//go:build linux && (amd64 || arm64)

package sandbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter every sandbox runs under.
//
// Reference: the default seccomp profile of Docker, containerd and Podman (moby/profiles,
// seccomp/default_linux.go). That profile is an allowlist: it refuses with EPERM every call
// it does not list, lists some calls only for containers that hold a capability (CAP_SYS_ADMIN
// for mount, CAP_SYS_MODULE for init_module, ...), allows clone only without namespace
// flags, clone3 not at all (ENOSYS, so that glibc falls back to clone), socket for every
// family but AF_ALG and AF_VSOCK, and personality for five values. kpush's sandboxes hold no
// capability, so every capability-gated call is one the profile refuses them.
//
// kpush's filter is the same policy written as a denylist, the way Flatpak builds bwrap's
// filter (flatpak-run.c, setup_seccomp): seccompRules lists every call that the profile
// refuses a container without capabilities (the complement of its allowlist over the syscall
// numbers golang.org/x/sys knows, less the deviations below), each with the capability the
// profile asks for (or "never" when no capability unlocks it) and a one-line reason.
// Everything else is allowed.
// The trade-off, the same as Flatpak's: a system call newer than this table is allowed, where
// the profile would refuse it; that keeps new kernels and new C libraries working without
// an update here, and the dangerous families (mounts, namespaces, modules, keys, BPF, perf)
// are covered by name.
//
// Where kpush deviates from the profile, and why:
//   - Only the native ABI: a call from another audit architecture (i386 on amd64, arm on
//     arm64) or through the x32 ABI (AUDIT_ARCH_X86_64 with nr bit 30 set) kills the process
//     (SECCOMP_RET_KILL_PROCESS). Their syscall numbers are not the table's, so a
//     denylist must refuse them wholesale; the profile instead repeats its allowlist for those
//     sub-architectures. Killing, not EPERM, because a process whose every call fails,
//     exit_group included, cannot even stop; libseccomp (so Flatpak) also kills by default
//     (SCMP_FLTATR_ACT_BADARCH, the thread there; the whole process here). Nr -1, which a tracer sets to skip a call, is let through.
//   - ioctl TIOCSTI and TIOCLINUX are refused, as Flatpak does (CVE-2017-5226, CVE-2023-28100):
//     they push input into the controlling terminal, and a sandbox may share the terminal of
//     whoever started kpush. Container runtimes give a container its own terminal instead.
//   - Calls newer than the profile's list: the mount-API open_tree_attr and listns
//     (enumerates namespaces) are refused like their families; file_getattr/file_setattr (the
//     path-based form of the FS_IOC_FSGETXATTR/FSSETXATTR ioctls the profile allows),
//     rseq_slice_yield and uprobe (entered only from a uprobe trampoline the kernel installs,
//     like uretprobe which the profile allows) are allowed.
//   - Syscalls Linux never implemented or has removed and answers ENOSYS for anyway
//     (getpmsg, putpmsg, afs_syscall, tuxcall, security, vserver) are not listed.
//   - Argument checks compare the low 32 bits only, which is what the kernel uses for every
//     argument checked here (socket's int family, ioctl's unsigned int request, personality's
//     unsigned int; clone's namespace flags all live in the low word). A full 64-bit compare
//     would let high bits smuggle a refused value past the filter (CVE-2019-10063 in Flatpak's
//     ioctl rule).
//   - ptrace, process_vm_readv and process_vm_writev are allowed, as the profile does on
//     kernels 4.8 and later (where seccomp re-checks a call a tracer changed); kpush needs
//     newer kernels than that anyway.

// SeccompFilter returns the sandbox's seccomp program in the form bubblewrap's --seccomp FD
// reads: an array of struct sock_filter in native byte order, as libseccomp's
// seccomp_export_bpf writes it. bwrap sets no_new_privs and loads it with PR_SET_SECCOMP
// just before it executes the command. The program is built once per process.
func SeccompFilter() ([]byte, error) {
	b, err := seccompFilterOnce()
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil
}

var seccompFilterOnce = sync.OnceValues(func() ([]byte, error) { return buildSeccompFilter(seccompRules) })

// seccompRule refuses one system call: always (arg nil) or only for some values of one
// argument.
type seccompRule struct {
	name  string
	nr    uint32
	errno unix.Errno  // what the refused call returns
	arg   *seccompArg // nil: every call
	// gate is what the default profile requires before it allows the call: a capability
	// (a kpush sandbox holds none), "never" (not in its allowlist at all), "newer than the
	// profile" (refused by its default action), "only some argument values", or "allowed;
	// kpush refuses it" (a deviation, see above).
	gate string
	why  string // what the call does that a sandbox must not
}

// seccompArg narrows a rule to some values of one argument's low 32 bits (see the note on
// argument checks above). Exactly one of its fields is set.
type seccompArg struct {
	index  int
	anyBit uint32   // refused when any of these bits is set
	oneOf  []uint32 // refused when the value is one of these
	noneOf []uint32 // refused unless the value is one of these
}

func seccompDeny(name string, nr uintptr, gate, why string) seccompRule {
	return seccompRule{name: name, nr: uint32(nr), errno: unix.EPERM, gate: gate, why: why}
}

func seccompDenyArg(name string, nr uintptr, arg seccompArg, gate, why string) seccompRule {
	return seccompRule{name: name, nr: uint32(nr), errno: unix.EPERM, arg: &arg, gate: gate, why: why}
}

// seccompCloneNewFlags are the flags the profile refuses in clone's flags (CLONE_NEWTIME shares
// its bit with the exit signal in clone and exists only for clone3 and unshare, both refused).
const seccompCloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// seccompPersonalities are the personality(2) values the profile allows (linux/personality.h).
var seccompPersonalities = []uint32{
	0x0000000,  // PER_LINUX
	0x0000008,  // PER_LINUX32
	0x0020000,  // UNAME26
	0x0020008,  // UNAME26 | PER_LINUX32
	0xffffffff, // query the current persona
}

// seccompRules is the deny table: the calls of both architectures, then seccompArchRules.
// Every refused call returns EPERM, what the kernel says to a caller that lacks the
// capability, except clone3.
var seccompRules = slices.Concat([]seccompRule{
	// Namespaces: a new user namespace hands out the capabilities below, the usual first
	// step of a kernel exploit from a container.
	seccompDeny("unshare", unix.SYS_UNSHARE, "CAP_SYS_ADMIN", "creates namespaces"),
	seccompDeny("setns", unix.SYS_SETNS, "CAP_SYS_ADMIN", "joins another namespace"),
	seccompDenyArg("clone", unix.SYS_CLONE, seccompArg{index: 0, anyBit: seccompCloneNewFlags},
		"CAP_SYS_ADMIN for CLONE_NEW* flags", "with a CLONE_NEW* flag: creates namespaces, like unshare"),
	{name: "clone3", nr: unix.SYS_CLONE3, errno: unix.ENOSYS, gate: "CAP_SYS_ADMIN (else ENOSYS)",
		why: "its flags sit in memory a filter cannot read; ENOSYS makes glibc fall back to clone"},

	// Mounts: they change what the sandbox sees of the file system.
	seccompDeny("mount", unix.SYS_MOUNT, "CAP_SYS_ADMIN", "mounts a file system or moves a mount"),
	seccompDeny("umount2", unix.SYS_UMOUNT2, "CAP_SYS_ADMIN", "unmounts, uncovering what a mount hid"),
	seccompDeny("pivot_root", unix.SYS_PIVOT_ROOT, "never", "changes the root mount"),
	seccompDeny("chroot", unix.SYS_CHROOT, "CAP_SYS_CHROOT", "changes the root directory (Docker grants the cap; kpush grants none)"),
	seccompDeny("open_tree", unix.SYS_OPEN_TREE, "CAP_SYS_ADMIN", "mount API: clones a mount tree"),
	seccompDeny("open_tree_attr", unix.SYS_OPEN_TREE_ATTR, "newer than the profile", "mount API: open_tree with mount attributes"),
	seccompDeny("move_mount", unix.SYS_MOVE_MOUNT, "CAP_SYS_ADMIN", "mount API: attaches a mount"),
	seccompDeny("mount_setattr", unix.SYS_MOUNT_SETATTR, "CAP_SYS_ADMIN", "mount API: changes mount flags (e.g. read-only off)"),
	seccompDeny("fsopen", unix.SYS_FSOPEN, "CAP_SYS_ADMIN", "mount API: creates a file system context"),
	seccompDeny("fsconfig", unix.SYS_FSCONFIG, "CAP_SYS_ADMIN", "mount API: configures a file system context"),
	seccompDeny("fsmount", unix.SYS_FSMOUNT, "CAP_SYS_ADMIN", "mount API: makes a mount from a context"),
	seccompDeny("fspick", unix.SYS_FSPICK, "CAP_SYS_ADMIN", "mount API: reconfigures an existing mount"),
	seccompDeny("quotactl", unix.SYS_QUOTACTL, "CAP_SYS_ADMIN", "reads and changes disk quotas of host file systems"),
	seccompDeny("quotactl_fd", unix.SYS_QUOTACTL_FD, "CAP_SYS_ADMIN", "quotactl by file descriptor"),
	seccompDeny("swapon", unix.SYS_SWAPON, "never", "adds host swap space"),
	seccompDeny("swapoff", unix.SYS_SWAPOFF, "never", "removes host swap space"),
	seccompDeny("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, "CAP_DAC_READ_SEARCH", "opens any inode by handle, bypassing mounts (the \"shocker\" escape)"),

	// The kernel itself.
	seccompDeny("kexec_load", unix.SYS_KEXEC_LOAD, "never", "loads a new kernel"),
	seccompDeny("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, "never", "loads a new kernel from a file"),
	seccompDeny("init_module", unix.SYS_INIT_MODULE, "CAP_SYS_MODULE", "loads a kernel module"),
	seccompDeny("finit_module", unix.SYS_FINIT_MODULE, "CAP_SYS_MODULE", "loads a kernel module from a file"),
	seccompDeny("delete_module", unix.SYS_DELETE_MODULE, "CAP_SYS_MODULE", "unloads a kernel module"),
	seccompDeny("nfsservctl", unix.SYS_NFSSERVCTL, "never", "kernel NFS server control (removed in Linux 3.1)"),
	seccompDeny("reboot", unix.SYS_REBOOT, "CAP_SYS_BOOT", "reboots or halts the host"),
	seccompDeny("syslog", unix.SYS_SYSLOG, "CAP_SYSLOG or CAP_SYS_ADMIN", "reads and clears the kernel log"),
	seccompDeny("acct", unix.SYS_ACCT, "CAP_SYS_PACCT", "switches process accounting"),
	seccompDeny("settimeofday", unix.SYS_SETTIMEOFDAY, "CAP_SYS_TIME", "sets the host clock"),
	seccompDeny("clock_settime", unix.SYS_CLOCK_SETTIME, "CAP_SYS_TIME", "sets the host clock"),
	seccompDeny("sethostname", unix.SYS_SETHOSTNAME, "CAP_SYS_ADMIN", "renames the host (or the UTS namespace)"),
	seccompDeny("setdomainname", unix.SYS_SETDOMAINNAME, "CAP_SYS_ADMIN", "renames the NIS domain"),
	seccompDeny("vhangup", unix.SYS_VHANGUP, "CAP_SYS_TTY_CONFIG", "hangs up the terminal"),

	// The kernel keyring is not namespaced: keys of other users and containers live there.
	seccompDeny("add_key", unix.SYS_ADD_KEY, "never", "adds a key to the kernel keyring"),
	seccompDeny("request_key", unix.SYS_REQUEST_KEY, "never", "finds a key, may run a host helper"),
	seccompDeny("keyctl", unix.SYS_KEYCTL, "never", "reads and changes kernel keyrings"),

	// Tracing, BPF and introspection: large kernel attack surface, host-wide information.
	seccompDeny("bpf", unix.SYS_BPF, "CAP_SYS_ADMIN or CAP_BPF", "loads BPF programs and maps"),
	seccompDeny("perf_event_open", unix.SYS_PERF_EVENT_OPEN, "CAP_SYS_ADMIN or CAP_PERFMON", "performance counters, a long list of CVEs"),
	seccompDeny("fanotify_init", unix.SYS_FANOTIFY_INIT, "CAP_SYS_ADMIN", "watches file access mount- or file-system-wide"),
	seccompDeny("lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE, "CAP_SYS_ADMIN", "resolves profiler cookies to host paths"),
	seccompDeny("kcmp", unix.SYS_KCMP, "CAP_SYS_PTRACE", "compares kernel objects of two processes (pointer leaks)"),
	seccompDeny("pidfd_getfd", unix.SYS_PIDFD_GETFD, "CAP_SYS_PTRACE", "steals a file descriptor from another process"),
	seccompDeny("process_madvise", unix.SYS_PROCESS_MADVISE, "CAP_SYS_PTRACE", "changes another process's memory advice"),
	seccompDeny("lsm_get_self_attr", unix.SYS_LSM_GET_SELF_ATTR, "CAP_SYS_ADMIN", "reads security module attributes"),
	seccompDeny("lsm_set_self_attr", unix.SYS_LSM_SET_SELF_ATTR, "CAP_SYS_ADMIN", "changes security module attributes"),
	seccompDeny("lsm_list_modules", unix.SYS_LSM_LIST_MODULES, "CAP_SYS_ADMIN", "lists the host's security modules"),
	seccompDeny("listns", unix.SYS_LISTNS, "newer than the profile", "enumerates namespaces"),

	// Memory: NUMA placement and page migration act beyond the caller's own share.
	seccompDeny("mbind", unix.SYS_MBIND, "CAP_SYS_NICE", "sets NUMA memory policy for a range"),
	seccompDeny("get_mempolicy", unix.SYS_GET_MEMPOLICY, "CAP_SYS_NICE", "reads NUMA memory policy"),
	seccompDeny("set_mempolicy", unix.SYS_SET_MEMPOLICY, "CAP_SYS_NICE", "sets NUMA memory policy"),
	seccompDeny("set_mempolicy_home_node", unix.SYS_SET_MEMPOLICY_HOME_NODE, "CAP_SYS_NICE", "sets the NUMA home node"),
	seccompDeny("migrate_pages", unix.SYS_MIGRATE_PAGES, "never", "moves a process's pages between NUMA nodes"),
	seccompDeny("move_pages", unix.SYS_MOVE_PAGES, "never", "moves pages between NUMA nodes"),
	seccompDeny("userfaultfd", unix.SYS_USERFAULTFD, "never", "user page-fault handling, a kernel race-exploit helper"),
	seccompDeny("io_uring_setup", unix.SYS_IO_URING_SETUP, "never", "io_uring: many kernel CVEs; the profile dropped it in 2023 (Docker 25)"),
	seccompDeny("io_uring_enter", unix.SYS_IO_URING_ENTER, "never", "io_uring"),
	seccompDeny("io_uring_register", unix.SYS_IO_URING_REGISTER, "never", "io_uring"),

	// Argument rules.
	seccompDenyArg("socket", unix.SYS_SOCKET, seccompArg{index: 0, oneOf: []uint32{unix.AF_ALG, unix.AF_VSOCK}},
		"only some argument values", "AF_ALG (kernel crypto API, CVEs) and AF_VSOCK (host-guest sockets)"),
	seccompDenyArg("personality", unix.SYS_PERSONALITY, seccompArg{index: 0, noneOf: seccompPersonalities},
		"only some argument values", "other personas turn off ASLR (ADDR_NO_RANDOMIZE) or map page 0 (MMAP_PAGE_ZERO)"),
	seccompDenyArg("ioctl", unix.SYS_IOCTL, seccompArg{index: 1, oneOf: []uint32{unix.TIOCSTI, unix.TIOCLINUX}},
		"allowed; kpush refuses it", "TIOCSTI/TIOCLINUX inject input into the controlling terminal (Flatpak)"),
}, seccompArchRules)

// Offsets in struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }.
// Both supported architectures are little-endian: an argument's low word comes first.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	seccompDataArgs = 16
)

// bpfMaxInsns is the kernel's limit on a classic BPF program (BPF_MAXINSNS).
const bpfMaxInsns = 4096

// buildSeccompFilter assembles rules into the program bytes.
func buildSeccompFilter(rules []seccompRule) ([]byte, error) {
	prog, err := seccompProgram(rules)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	if len(raw) > bpfMaxInsns {
		return nil, fmt.Errorf("seccomp filter has %d instructions, the kernel takes at most %d", len(raw), bpfMaxInsns)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, ins := range raw { // struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }
		out = binary.NativeEndian.AppendUint16(out, ins.Op)
		out = append(out, ins.Jt, ins.Jf)
		out = binary.NativeEndian.AppendUint32(out, ins.K)
	}
	return out, nil
}

// seccompProgram is the filter as instructions:
//
//	arch != native            → kill the process
//	nr == -1                  → allow (a tracer skipping the call)
//	(amd64) nr has bit 30     → kill the process (x32 ABI)
//	for each rule: nr == rule → its return (or its argument check)
//	                          → allow
//
// Each rule is "jne nr, skip body; body", and every body ends in a return, so no jump
// spans more than one rule (classic BPF jumps reach 255 instructions) and calls without
// argument checks stay constant decisions the kernel caches (its seccomp action cache).
func seccompProgram(rules []seccompRule) ([]bpf.Instruction, error) {
	const (
		allow = unix.SECCOMP_RET_ALLOW
		kill  = unix.SECCOMP_RET_KILL_PROCESS
	)
	p := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompDataArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: seccompNativeArch, SkipTrue: 1},
		bpf.RetConstant{Val: kill},
		bpf.LoadAbsolute{Off: seccompDataNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0xffffffff, SkipTrue: 1},
		bpf.RetConstant{Val: allow},
	}
	if seccompX32Bit != 0 {
		p = append(p,
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: seccompX32Bit, SkipFalse: 1},
			bpf.RetConstant{Val: kill},
		)
	}
	seen := map[uint32]string{}
	for _, r := range rules {
		if prev, dup := seen[r.nr]; dup {
			return nil, fmt.Errorf("seccomp rules %s and %s share syscall number %d", prev, r.name, r.nr)
		}
		seen[r.nr] = r.name
		refuse := bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(r.errno)&unix.SECCOMP_RET_DATA}
		var body []bpf.Instruction
		switch a := r.arg; {
		case a == nil:
			body = []bpf.Instruction{refuse}
		case a.anyBit != 0:
			body = []bpf.Instruction{
				a.load(),
				bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: a.anyBit, SkipFalse: 1},
				refuse,
				bpf.RetConstant{Val: allow},
			}
		case len(a.oneOf) > 0: // any match jumps over "allow" to "refuse"
			body = append(body, a.load())
			for i, v := range a.oneOf {
				body = append(body, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(len(a.oneOf) - i)})
			}
			body = append(body, bpf.RetConstant{Val: allow}, refuse)
		case len(a.noneOf) > 0: // any match jumps over "refuse" to "allow"
			body = append(body, a.load())
			for i, v := range a.noneOf {
				body = append(body, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(len(a.noneOf) - i)})
			}
			body = append(body, refuse, bpf.RetConstant{Val: allow})
		default:
			return nil, fmt.Errorf("seccomp rule %s: empty argument check", r.name)
		}
		if len(body) > 255 {
			return nil, fmt.Errorf("seccomp rule %s: %d instructions is beyond a BPF jump", r.name, len(body))
		}
		p = append(p, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: r.nr, SkipTrue: uint8(len(body))})
		p = append(p, body...)
	}
	return append(p, bpf.RetConstant{Val: allow}), nil
}

// load loads the argument's low 32 bits into A.
func (a *seccompArg) load() bpf.Instruction {
	return bpf.LoadAbsolute{Off: uint32(seccompDataArgs + 8*a.index), Size: 4}
}
