package receiver

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRemoveLeftovers: build contexts a killed process left (older than this process) are
// removed; those of apps with a build running in a live process, and newer ones, stay; the
// builder is asked to clean its own.
func TestRemoveLeftovers(t *testing.T) {
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	b := &forgettingBuilder{}
	p := &Pipeline{Store: store, Builder: b, WorkDir: work}
	for _, app := range []string{"dead", "live", "my-app"} {
		if err := store.CreateApp(&App{Name: app}); err != nil {
			t.Fatal(err)
		}
	}
	// live has a pending build of this (live) process; dead's pending build is another's.
	if _, err := store.NewBuild("live", &Build{Status: StatusPending}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewBuild("dead", &Build{Status: StatusPending, Owner: "gone_1_x"}); err != nil {
		t.Fatal(err)
	}
	old := processStart.Add(-time.Hour)
	mk := func(name string, mtime time.Time) string {
		d := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name  string
		mtime time.Time
		kept  bool
	}{
		{"kpush-src-dead-123", old, false},
		{"kpush-src-my-app-456", old, false},
		{"kpush-src-live-789", old, true},                         // its build runs
		{"kpush-src-dead-999", time.Now().Add(time.Minute), true}, // newer than this process
		{"other-dir", old, true},                                  // not kpush's
	} {
		mk(tc.name, tc.mtime)
		defer func() {
			_, err := os.Stat(filepath.Join(work, tc.name))
			if kept := err == nil; kept != tc.kept {
				t.Errorf("%s kept = %v, want %v", tc.name, kept, tc.kept)
			}
		}()
	}
	p.RemoveLeftovers()
	if len(b.cleaned) != 1 || !b.cleaned[0].Equal(processStart) {
		t.Errorf("builder cleaned %v, want once with the process start", b.cleaned)
	}
}
