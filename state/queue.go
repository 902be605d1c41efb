package state

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The per-app queue of one waiting push and the cancel request a running build watches for,
// as JSON files beside the app's record (Store).

// QueueEntry is the one push (or rebuild) of an app waiting for the app's running build,
// <data>/state/apps/<app>/queue.json. A newer one replaces it; the replaced waiter notices
// and gives up ("superseded by vN").
type QueueEntry struct {
	Release int       `json:"release"`
	PushID  string    `json:"push_id,omitempty"`
	User    string    `json:"user"`
	Commit  string    `json:"commit"`
	Since   time.Time `json:"since"`
	Owner   string    `json:"owner"`
}

// CancelRequest asks the process running release Release of an app to cancel its build
// (builds:cancel), <data>/state/apps/<app>/cancel.json.
type CancelRequest struct {
	Release int       `json:"release"`
	User    string    `json:"user"`
	At      time.Time `json:"at"`
	Via     string    `json:"via,omitempty"` // the command: "builds:cancel" (also when empty) or "apps:unlock"
}

// The files of the queue and of cancel requests in an app's state directory.
const (
	queueFile  = "queue.json"
	cancelFile = "cancel.json"
)

func (s *Store) queuePath(app string) string { return filepath.Join(s.appDir(app), queueFile) }

// Enqueue makes e app's queued push, replacing an older one (its waiter learns from Queued).
// When a newer push is queued already, e is not queued and that one is returned.
func (s *Store) Enqueue(app string, e QueueEntry) (newer *QueueEntry, err error) {
	err = s.lockApp(app, func() error {
		cur, err := s.Queued(app)
		if err != nil {
			return err
		}
		if cur != nil && cur.Release > e.Release {
			newer = cur
			return nil
		}
		return writeJSON(s.queuePath(app), e)
	})
	if err == nil && newer == nil {
		s.notify(app)
	}
	return newer, err
}

// Queued returns app's queued push, nil when none.
func (s *Store) Queued(app string) (*QueueEntry, error) {
	var e QueueEntry
	err := readJSON(s.queuePath(app), &e)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// Dequeue removes app's queued push if it is release's.
func (s *Store) Dequeue(app string, release int) error {
	return s.lockApp(app, func() error {
		cur, err := s.Queued(app)
		if err != nil || cur == nil || cur.Release != release {
			return err
		}
		if err := os.Remove(s.queuePath(app)); err != nil {
			return err
		}
		s.notify(app)
		return nil
	})
}

func (s *Store) cancelPath(app string) string { return filepath.Join(s.appDir(app), cancelFile) }

// RequestCancel asks whichever process runs release r of app to cancel its build.
func (s *Store) RequestCancel(app string, c CancelRequest) error {
	if err := writeJSON(s.cancelPath(app), c); err != nil {
		return err
	}
	s.notify(app)
	return nil
}

// CancelRequested returns the cancel request for release n of app, nil when there is none.
func (s *Store) CancelRequested(app string, n int) *CancelRequest {
	var c CancelRequest
	if err := readJSON(s.cancelPath(app), &c); err != nil || c.Release != n {
		return nil
	}
	return &c
}
