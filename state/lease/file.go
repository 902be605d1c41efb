package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gofrs/flock"

	"kpush.dev/kpush/internal/atomicfile"
)

// NewFile returns a Manager whose leases are files in dir (created 0700 if missing): for
// several `kpush dev` processes sharing one data directory. <dir>/<app>.json holds the lease
// (Info plus a version counter); every read-compare-write holds flock(2) on <dir>/<app>.lock
// for its few microseconds only, so the lease itself is the TTL'd record, exactly as with
// NewKube: a killed process leaves a record that expires after the TTL (the kernel drops its
// flock at once), and Break deletes the record. Acquire polls (no change notification).
// Unlike the other stores, a record whose holder is a process of this host that is gone
// (ProcessGone: a crashed dev server) is free at once: the processes sharing a data directory
// run on one machine, where a dead pid is certain.
func NewFile(dir string, opts ...Option) (*Manager, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating lease directory: %w", err)
	}
	return newManager(&fileStore{dir: dir}, opts, nil), nil
}

type fileStore struct{ dir string }

type fileRecord struct {
	Version int64 `json:"version"`
	Info
}

func (s *fileStore) holderDead(holder string) bool { return ProcessGone(holder) }

func (s *fileStore) where(app string) string { return "lease file " + s.path(app) }

func (s *fileStore) path(app string) string { return filepath.Join(s.dir, app+".json") }

// locked runs f while holding an exclusive flock on app's lock file.
func (s *fileStore) locked(app string, f func() error) error {
	l := flock.New(filepath.Join(s.dir, app+".lock"))
	if err := l.Lock(); err != nil {
		return fmt.Errorf("locking %s: %w", l.Path(), err)
	}
	defer l.Unlock() //nolint:errcheck // closing drops it anyway
	return f()
}

func (s *fileStore) read(app string) (fileRecord, error) {
	var r fileRecord
	b, err := os.ReadFile(s.path(app))
	if errors.Is(err, fs.ErrNotExist) {
		return r, errNotFound
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decoding %s: %w", s.path(app), err)
	}
	return r, nil
}

func (s *fileStore) write(app string, r fileRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path(app), b, 0o600)
}

func (s *fileStore) get(_ context.Context, app string) (Info, string, error) {
	var r fileRecord
	err := s.locked(app, func() (err error) { r, err = s.read(app); return err })
	if err != nil {
		return Info{}, "", err
	}
	return r.Info, strconv.FormatInt(r.Version, 10), nil
}

func (s *fileStore) create(_ context.Context, app string, i Info) (string, error) {
	// A re-created record starts its versions at the clock, not at 1, so that a holder whose
	// record was broken and re-created by someone else cannot match the new version.
	first := time.Now().UnixNano()
	err := s.locked(app, func() error {
		if _, err := s.read(app); !errors.Is(err, errNotFound) {
			if err == nil {
				return errStale
			}
			return err
		}
		return s.write(app, fileRecord{Version: first, Info: i})
	})
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(first, 10), nil
}

func (s *fileStore) update(_ context.Context, app string, i Info, version string) (string, error) {
	var next int64
	err := s.locked(app, func() error {
		r, err := s.read(app)
		if err != nil {
			return err
		}
		if strconv.FormatInt(r.Version, 10) != version {
			return errStale
		}
		next = r.Version + 1
		return s.write(app, fileRecord{Version: next, Info: i})
	})
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(next, 10), nil
}

func (s *fileStore) remove(_ context.Context, app string) error {
	return s.locked(app, func() error {
		err := os.Remove(s.path(app))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	})
}

func (s *fileStore) changed(context.Context, string, string) (<-chan struct{}, func()) {
	return nil, nil
}
