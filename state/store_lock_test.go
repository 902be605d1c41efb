package state

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The release lock is held by one caller at a time; a waiter is told the holder's note once,
// gives up when its context ends, and gets the lock once the holder unlocks.
func TestLockReleaseTakesTurns(t *testing.T) {
	s, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	unlock, err := s.LockRelease(ctx, "demo", "v1 push by alice", nil)
	if err != nil {
		t.Fatal(err)
	}

	var told []string
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := s.LockRelease(short, "demo", "v2", func(h string) { told = append(told, h) }); err == nil || !strings.Contains(err.Error(), "waiting for the release lock of app demo") {
		t.Fatalf("LockRelease while held = %v, want a wait that ends with the context", err)
	}
	if len(told) != 1 || told[0] != "v1 push by alice" {
		t.Errorf("waiting was told %q, want the holder's note once", told)
	}
	if u, err := s.LockRelease(ctx, "other", "other app", nil); err != nil {
		t.Errorf("another app's release lock: %v", err)
	} else {
		u()
	}

	got, waits := make(chan error, 1), make(chan struct{})
	go func() {
		u, err := s.LockRelease(ctx, "demo", "v2 push by bob", func(string) { close(waits) })
		if err == nil {
			b, _ := os.ReadFile(filepath.Join(s.dir, ".locks", "demo.release"))
			if string(b) != "v2 push by bob\n" {
				t.Errorf("lock file holds %q while bob holds it", b)
			}
			u()
		}
		got <- err
	}()
	<-waits // bob found it held
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("LockRelease after unlock: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockRelease did not get the lock after unlock")
	}
	if b, _ := os.ReadFile(filepath.Join(s.dir, ".locks", "demo.release")); len(b) != 0 {
		t.Errorf("lock file holds %q after unlock, want it empty", b)
	}
}

// A Store's owner is alive while it is open, to itself and to another Store on the data dir,
// and gone once it is closed.
func TestOwnerAliveWhileTheStoreIsOpen(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !a.OwnerAlive(a.Owner()) || !b.OwnerAlive(a.Owner()) {
		t.Errorf("open store's owner: alive to itself %v, to another %v; want both", a.OwnerAlive(a.Owner()), b.OwnerAlive(a.Owner()))
	}
	if b.OwnerAlive("") || b.OwnerAlive("../x") || b.OwnerAlive("host_1_never") {
		t.Error("an empty, a path-like or an unknown owner is alive")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if a.OwnerAlive(a.Owner()) || b.OwnerAlive(a.Owner()) {
		t.Error("a closed store's owner is alive")
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "owners", a.Owner()+".lock")); !os.IsNotExist(err) {
		t.Errorf("closed owner's lock file: %v, want it removed", err)
	}
}
