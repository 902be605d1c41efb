package buildpack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/gofrs/flock"

	"kpush.dev/kpush/internal/names"
)

// lockRetry is how often a build waiting for another process's build of the same app tries
// the cross-process lock again.
const lockRetry = 200 * time.Millisecond

// appLock returns the in-process lock of app's builds: a channel of capacity one, held while
// it has a value in it.
func (l *Local) appLock(app string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.appLocks == nil {
		l.appLocks = map[string]chan struct{}{}
	}
	ch, ok := l.appLocks[app]
	if !ok {
		ch = make(chan struct{}, 1)
		l.appLocks[app] = ch
	}
	return ch
}

// fileLock is the cross-process lock of app's builds, <DataDir>/cache/<app>.lock.
func (l *Local) fileLock(app string) *flock.Flock {
	return flock.New(filepath.Join(l.DataDir, "cache", app+".lock"),
		flock.SetFlag(os.O_CREATE|os.O_RDWR), flock.SetPermissions(0o644))
}

// lockApp serialises builds of one app: in this process with a channel (so ctx can cancel
// the wait), across processes with flock on <DataDir>/cache/<app>.lock. It prints the
// "Waiting for another build" line to out once, if it has to wait for either.
func (l *Local) lockApp(ctx context.Context, app string, out io.Writer) (func(), error) {
	ch := l.appLock(app)
	told := false
	tell := func() {
		if !told {
			fmt.Fprintf(out, "-----> Waiting for another build of %s to finish\n", app)
			told = true
		}
	}
	select {
	case ch <- struct{}{}:
	default:
		tell()
		select {
		case ch <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another build of %s: %w", app, ctx.Err())
		}
	}
	release := func() { <-ch }
	if err := os.MkdirAll(filepath.Join(l.DataDir, "cache"), 0o755); err != nil {
		release()
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	fl := l.fileLock(app)
	ok, err := fl.TryLock()
	if err == nil && !ok {
		tell()
		ok, err = fl.TryLockContext(ctx, lockRetry)
	}
	if !ok {
		release()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for another build of %s: %w", app, ctx.Err())
		}
		return nil, fmt.Errorf("locking build cache: %w", err)
	}
	return func() { fl.Unlock(); release() }, nil
}

// tryLockApp takes app's build lock (lockApp) if nobody holds it, in this process or another.
func (l *Local) tryLockApp(app string) (unlock func(), ok bool) {
	ch := l.appLock(app)
	select {
	case ch <- struct{}{}:
	default:
		return nil, false
	}
	fl := l.fileLock(app)
	if ok, err := fl.TryLock(); !ok || err != nil {
		<-ch
		return nil, false
	}
	return func() { fl.Unlock(); <-ch }, true
}

// buildDirName is a per-build directory's name: "<app>-<tag>" (newTag).
var buildDirName = regexp.MustCompile(`^(.+)-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$`)

// buildDirApp returns the app of a per-build directory name.
func buildDirApp(name string) (string, bool) {
	m := buildDirName.FindStringSubmatch(name)
	if m == nil || !names.IsApp(m[1]) {
		return "", false
	}
	return m[1], true
}

// ForgetApp removes what Local keeps of app: its build cache (<DataDir>/cache/<app>) and any
// per-build directory a crashed build left. It waits (up to a minute) for a running build of
// app. It implements receiver.AppForgetter, for apps:destroy.
func (l *Local) ForgetApp(app string) error {
	if !names.IsApp(app) {
		return fmt.Errorf("app name %q is not a DNS-1035 label", app)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unlock, err := l.lockApp(ctx, app, io.Discard)
	if err != nil {
		return err
	}
	defer unlock() // the lock file stays: another process may be waiting on it
	if err := os.RemoveAll(filepath.Join(l.DataDir, "cache", app)); err != nil {
		return fmt.Errorf("removing the build cache of %s: %w", app, err)
	}
	ents, _ := os.ReadDir(filepath.Join(l.DataDir, "builds"))
	for _, e := range ents {
		if a, ok := buildDirApp(e.Name()); ok && a == app {
			if err := os.RemoveAll(filepath.Join(l.DataDir, "builds", e.Name())); err != nil {
				return fmt.Errorf("removing a build directory of %s: %w", app, err)
			}
		}
	}
	return l.ids().Release("build/" + app)
}

// RemoveLeftovers removes per-build directories (<DataDir>/builds/<app>-<tag>) that a killed
// process left behind: those last modified before before (the process start) whose app no
// build holds the build lock of, here or in another process sharing DataDir (a running build
// holds it for as long as its directory exists). It returns the paths removed.
func (l *Local) RemoveLeftovers(before time.Time) ([]string, error) {
	dir := filepath.Join(l.DataDir, "builds")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing build directories: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(l.DataDir, "cache"), 0o755); err != nil {
		return nil, fmt.Errorf("creating cache directory: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		app, ok := buildDirApp(e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(before) {
			continue
		}
		unlock, ok := l.tryLockApp(app)
		if !ok {
			continue // a build of app is running
		}
		p := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		} else {
			removed = append(removed, p)
		}
		unlock()
	}
	return removed, errors.Join(errs...)
}
