//go:build linux

package sandbox

import "golang.org/x/sys/unix"

// seccompNativeArch is seccomp_data.arch of native calls.
const seccompNativeArch = unix.AUDIT_ARCH_X86_64

// seccompX32Bit marks x32 ABI calls, which arrive with AUDIT_ARCH_X86_64 too
// (__X32_SYSCALL_BIT); the filter kills them.
const seccompX32Bit = 0x40000000

// seccompArchRules are the amd64-only entries of the deny table (see seccompRules).
var seccompArchRules = []seccompRule{
	seccompDeny("iopl", unix.SYS_IOPL, "CAP_SYS_RAWIO", "raises the I/O privilege level: direct port access"),
	seccompDeny("ioperm", unix.SYS_IOPERM, "CAP_SYS_RAWIO", "grants direct I/O port access"),
	seccompDeny("uselib", unix.SYS_USELIB, "never", "obsolete a.out library loader"),
	seccompDeny("ustat", unix.SYS_USTAT, "never", "obsolete file system statistics by device"),
	seccompDeny("sysfs", unix.SYS_SYSFS, "never", "obsolete file system type lookup"),
	seccompDeny("_sysctl", unix.SYS__SYSCTL, "never", "obsolete binary sysctl (removed in Linux 5.5)"),
	seccompDeny("create_module", unix.SYS_CREATE_MODULE, "never", "obsolete module call (removed in Linux 2.6)"),
	seccompDeny("get_kernel_syms", unix.SYS_GET_KERNEL_SYMS, "never", "obsolete module call (removed in Linux 2.6)"),
	seccompDeny("query_module", unix.SYS_QUERY_MODULE, "never", "obsolete module call (removed in Linux 2.6)"),
}
