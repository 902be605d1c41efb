//go:build !linux || !(amd64 || arm64)

package sandbox

import (
	"fmt"
	"runtime"
)

// SeccompFilter has no program for this platform: kpush's filter is written for linux/amd64
// and linux/arm64 (see seccomp.go).
func SeccompFilter() ([]byte, error) {
	return nil, fmt.Errorf("no seccomp filter for %s/%s (kpush's sandboxes need linux/amd64 or linux/arm64)", runtime.GOOS, runtime.GOARCH)
}
