package lease

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestProcessGone: which holder identities name a process of this host known to be gone.
func TestProcessGone(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	m := NewLocal() // registers its identity as one of this process's
	dead := strconv.Itoa(deadPID(t))
	me := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		holder string
		want   bool
	}{
		{host + "_" + dead + "_0badc0de#1", true},     // this host, pid gone
		{host + "_1_0badc0de#3", false},               // this host, pid 1 runs
		{m.Identity() + "#2", false},                  // a Manager of this process
		{host + "_" + me + "_deadbeef#1", true},       // this pid, an identity of a previous process
		{"other-host_" + dead + "_0badc0de#1", false}, // another host: unknown
		{"a#1", false}, {"", false}, {host + "_x_abc#1", false}, // other forms
	} {
		if got := ProcessGone(tc.holder); got != tc.want {
			t.Errorf("ProcessGone(%q) = %v, want %v", tc.holder, got, tc.want)
		}
	}
}

// TestFileDeadHolderFreeAtOnce: a lease file left by a crashed dev server of this host (its
// pid gone) with an hour of TTL left is free at once: Holder says not held and Acquire takes
// it without waiting; a live holder's lease (this process's) still blocks.
func TestFileDeadHolderFreeAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	host, _ := os.Hostname()
	st := &fileStore{dir: dir}
	now := time.Now()
	crashed := Info{App: "demo", Holder: host + "_" + strconv.Itoa(deadPID(t)) + "_0badc0de#1", Note: "v2 by alice, abc1234",
		Acquired: now, Renewed: now, TTL: time.Hour}
	if _, err := st.create(ctx, "demo", crashed); err != nil {
		t.Fatal(err)
	}
	m, err := NewFile(dir, WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, held, err := m.Holder(ctx, "demo"); err != nil || held {
		t.Errorf("Holder of a dead process's lease: held=%v, %v; want not held", held, err)
	}
	start := time.Now()
	l, err := m.Acquire(ctx, "demo", "v3 by bob, def5678", nil)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Acquire took %s; want at once", took)
	}
	// Held by a live process (this one): another Manager waits.
	other, _ := NewFile(dir, WithTTL(time.Hour))
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	if l2, err := other.Acquire(wctx, "demo", "v4", nil); err == nil {
		l2.Release(ctx)
		t.Error("a second Manager took a lease held by a live process")
	}
	l.Release(ctx)
}
