package gitserver

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestMain lets the test binary be the pre-receive hook: New's default hook command is this
// executable followed by "hook", "pre-receive", exactly as for the kpush binary.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "hook" {
		os.Exit(RunHook(context.Background(), os.Args[2], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
	}
	// The hook is this race-enabled binary: without this its race runtime sleeps 1 s at exit.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}
