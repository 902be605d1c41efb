package state

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// wokenWithin reports whether ch receives within d, which the tests keep below
// watchFallback so that only the change itself can wake it.
func wokenWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func TestChangesWakesOnThisProcesssQueueAndCancel(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateApp(&App{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := s.Changes(ctx, "demo")
	other := s.Changes(ctx, "other")
	steps := []struct {
		name   string
		change func() error
	}{
		{"enqueue", func() error { _, err := s.Enqueue("demo", QueueEntry{Release: 2}); return err }},
		{"dequeue", func() error { return s.Dequeue("demo", 2) }},
		{"cancel", func() error { return s.RequestCancel("demo", CancelRequest{Release: 2}) }},
	}
	for _, st := range steps {
		if err := st.change(); err != nil {
			t.Fatal(err)
		}
		if !wokenWithin(ch, watchFallback/2) {
			t.Errorf("%s: the watcher was not woken", st.name)
		}
	}
	if wokenWithin(other, watchFallback/4) {
		t.Error("a watcher of another app was woken")
	}
}

// TestChangesWakesOnAnotherProcesssCancel has a second process sharing the data dir ask for a
// cancel, as builds:cancel on another kpush does: inotify wakes this process's watcher.
func TestChangesWakesOnAnotherProcesssCancel(t *testing.T) {
	data := t.TempDir()
	s, err := OpenStore(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateApp(&App{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := s.Changes(ctx, "demo")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRequestCancel$")
	cmd.Env = append(os.Environ(), "KPUSH_STATE_TEST_DATA="+data)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("other process: %v\n%s", err, out)
	}
	if !wokenWithin(ch, watchFallback/2) {
		t.Fatal("the other process's cancel request did not wake the watcher")
	}
	if c := s.CancelRequested("demo", 3); c == nil || c.User != "bob" {
		t.Errorf("CancelRequested = %+v, want bob's", c)
	}
}

// TestHelperRequestCancel is the other process of TestChangesWakesOnAnotherProcesssCancel.
func TestHelperRequestCancel(t *testing.T) {
	data := os.Getenv("KPUSH_STATE_TEST_DATA")
	if data == "" {
		t.Skip("run by TestChangesWakesOnAnotherProcesssCancel")
	}
	s, err := OpenStore(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestCancel("demo", CancelRequest{Release: 3, User: "bob", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
}
