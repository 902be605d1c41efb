package ops

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTrackerWaitReturnsWhenAllEnded(t *testing.T) {
	var tr Tracker
	if err := tr.Wait(t.Context()); err != nil {
		t.Fatalf("Wait with nothing in flight: %v", err)
	}
	end1, end2 := tr.Begin(), tr.Begin()
	if n := tr.Running(); n != 2 {
		t.Fatalf("Running = %d, want 2", n)
	}
	waited := make(chan error, 1)
	go func() { waited <- tr.Wait(t.Context()) }()

	end1()
	end1() // a second end changes nothing: end2's operation still runs
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v with one operation still in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	end2()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return 5 s after the last operation ended")
	}
	if n := tr.Running(); n != 0 {
		t.Errorf("Running = %d after all ended, want 0", n)
	}

	// The tracker is reusable: a new operation is waited for again.
	end3 := tr.Begin()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := tr.Wait(ctx); err == nil {
		t.Error("Wait returned nil with an operation begun after the tracker was idle")
	}
	end3()
}

func TestTrackerWaitDeadline(t *testing.T) {
	var tr Tracker
	end := tr.Begin()
	defer end()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	err := tr.Wait(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait at the deadline: %v, want context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "1 operations in flight") {
		t.Errorf("Wait error does not say how many still run: %v", err)
	}
}

// TestTrackerBeginWhileWaiting: an operation that begins after the others ended but before
// Wait noticed is waited for too.
func TestTrackerBeginWhileWaiting(t *testing.T) {
	var tr Tracker
	end1 := tr.Begin()
	waited := make(chan error, 1)
	go func() { waited <- tr.Wait(t.Context()) }()
	time.Sleep(10 * time.Millisecond) // let Wait block on end1's operation
	end2 := tr.Begin()
	end1()
	select {
	case err := <-waited:
		if tr.Running() != 0 {
			t.Fatalf("Wait returned %v with an operation in flight", err)
		}
	case <-time.After(50 * time.Millisecond):
	}
	end2()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after every operation ended")
	}
}

func TestNilTracker(t *testing.T) {
	var tr *Tracker
	tr.Begin()()
	if tr.Running() != 0 {
		t.Error("nil Tracker runs something")
	}
	if err := tr.Wait(t.Context()); err != nil {
		t.Errorf("nil Tracker Wait: %v", err)
	}
}
