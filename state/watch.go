package state

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchFallback is how often a watcher is woken with no event: the safety net for file
// systems that report no changes (NFS, some overlay set-ups) or a watch that could not be
// added (inotify limits).
const watchFallback = 2 * time.Second

// Changes returns a channel that receives when app's queue or cancel request may have
// changed (Enqueue, Dequeue, RequestCancel), until ctx is done: at once for this process's
// changes, through inotify (fsnotify) for those of other processes sharing the data dir, and
// at least every couple of seconds regardless. Receivers re-read what they wait for
// (Queued, CancelRequested); a wake-up says nothing about what changed. A change made
// between the last read and the call is not reported: call Changes before the first read.
func (s *Store) Changes(ctx context.Context, app string) <-chan struct{} {
	dir := s.appDir(app)
	ch := make(chan struct{}, 1)
	hub.subscribe(dir, ch)
	go func() {
		defer hub.unsubscribe(dir, ch)
		t := time.NewTicker(watchFallback)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				wake(ch)
			}
		}
	}()
	return ch
}

// notify wakes this process's watchers of app at once (no need to wait for inotify).
func (s *Store) notify(app string) { hub.notify(s.appDir(app)) }

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// hub is the process's one inotify instance (there are 128 per user by default), shared by
// every Store: app directories are watched while someone waits on them.
var hub = &watchHub{subs: map[string]map[chan struct{}]bool{}}

type watchHub struct {
	mu   sync.Mutex
	w    *fsnotify.Watcher // nil until first needed, or when inotify is unavailable
	err  error             // why w is nil after trying
	subs map[string]map[chan struct{}]bool
}

func (h *watchHub) subscribe(dir string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil && h.err == nil {
		if h.w, h.err = fsnotify.NewWatcher(); h.err == nil {
			go h.run(h.w)
		}
	}
	if h.subs[dir] == nil {
		h.subs[dir] = map[chan struct{}]bool{}
		if h.w != nil {
			_ = h.w.Add(dir) // failing (no such dir yet, limits): the fallback ticker wakes it
		}
	}
	h.subs[dir][ch] = true
}

func (h *watchHub) unsubscribe(dir string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[dir], ch)
	if len(h.subs[dir]) == 0 {
		delete(h.subs, dir)
		if h.w != nil {
			_ = h.w.Remove(dir)
		}
	}
}

func (h *watchHub) notify(dir string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[dir] {
		wake(ch)
	}
}

// run wakes the watchers of a directory on any change of its queue or cancel file (written
// by rename, so a create; removed, so a remove).
func (h *watchHub) run(w *fsnotify.Watcher) {
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			switch filepath.Base(ev.Name) {
			case queueFile, cancelFile:
				h.notify(filepath.Dir(ev.Name))
			}
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
		}
	}
}
