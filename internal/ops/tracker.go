package ops

import (
	"context"
	"fmt"
	"sync"
)

// Tracker counts operations in flight (builds, deploys) so that shutdown can let them finish
// up to a deadline. The zero value is ready to use; a nil *Tracker tracks nothing. Safe for
// concurrent use.
//
//	end := t.Begin()
//	defer end()
//	…
//	// at shutdown, after the SSH server stopped accepting connections:
//	err := t.Wait(ctx) // ctx carries the grace deadline
type Tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0; nil means "idle" too
}

// Begin counts one operation in flight until end is called. Calling end more than once has
// no further effect.
func (t *Tracker) Begin() (end func()) {
	if t == nil {
		return func() {}
	}
	t.mu.Lock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			t.n--
			if t.n == 0 {
				close(t.idle)
			}
			t.mu.Unlock()
		})
	}
}

// Running is the number of operations in flight.
func (t *Tracker) Running() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Wait returns nil once no operation is in flight, or, if ctx ends first, an error wrapping
// ctx's error (context.DeadlineExceeded at the grace deadline) that says how many were still
// running. Operations begun while Wait waits are waited for too.
func (t *Tracker) Wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	for {
		t.mu.Lock()
		if t.n == 0 {
			t.mu.Unlock()
			return nil
		}
		idle := t.idle
		t.mu.Unlock()
		select {
		case <-idle:
			// Loop: another operation may have begun since.
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d operations in flight: %w", t.Running(), ctx.Err())
		}
	}
}
