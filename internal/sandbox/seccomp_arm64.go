//go:build linux

package sandbox

import "golang.org/x/sys/unix"

// seccompNativeArch is seccomp_data.arch of native calls.
const seccompNativeArch = unix.AUDIT_ARCH_AARCH64

// seccompX32Bit is 0: arm64 has no second ABI under its own audit arch.
const seccompX32Bit = 0

// seccompArchRules are the arm64-only entries of the deny table (see seccompRules): none,
// arm64 never had the legacy calls amd64 lists.
var seccompArchRules []seccompRule
