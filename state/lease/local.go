package lease

import (
	"context"
	"strconv"
	"sync"
)

// NewLocal returns a Manager whose leases live in this process (for `kpush dev`, one
// process). Semantics are those of NewKube: TTL, renewal, expiry, Break.
func NewLocal(opts ...Option) *Manager {
	return newManager(&memStore{leases: map[string]*memLease{}}, opts, nil)
}

type memStore struct {
	mu     sync.Mutex
	leases map[string]*memLease
	seq    int64
	wake   map[string]chan struct{} // closed on the next change of that app's lease
}

type memLease struct {
	info    Info
	version string
}

func (s *memStore) where(app string) string { return "in-process lease of app " + app }

func (s *memStore) get(_ context.Context, app string) (Info, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[app]
	if !ok {
		return Info{}, "", errNotFound
	}
	return l.info, l.version, nil
}

// put stores i under a new version and wakes waiters; s.mu is held.
func (s *memStore) put(app string, i Info) string {
	s.seq++
	v := strconv.FormatInt(s.seq, 10)
	s.leases[app] = &memLease{info: i, version: v}
	s.notify(app)
	return v
}

func (s *memStore) notify(app string) {
	if ch, ok := s.wake[app]; ok {
		close(ch)
		delete(s.wake, app)
	}
}

func (s *memStore) create(_ context.Context, app string, i Info) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.leases[app]; ok {
		return "", errStale
	}
	return s.put(app, i), nil
}

func (s *memStore) update(_ context.Context, app string, i Info, version string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[app]
	switch {
	case !ok:
		return "", errNotFound
	case l.version != version:
		return "", errStale
	}
	return s.put(app, i), nil
}

func (s *memStore) remove(_ context.Context, app string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leases, app)
	s.notify(app)
	return nil
}

func (s *memStore) changed(_ context.Context, app, version string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[app]; !ok || l.version != version {
		ch := make(chan struct{})
		close(ch)
		return ch, nil
	}
	if s.wake == nil {
		s.wake = map[string]chan struct{}{}
	}
	ch, ok := s.wake[app]
	if !ok {
		ch = make(chan struct{})
		s.wake[app] = ch
	}
	return ch, nil
}
