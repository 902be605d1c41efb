// Package state keeps kpush's app state — app records, releases, builds, the queued push and
// cancel requests — as JSON files in the data dir, each written atomically, every
// read-modify-write of an app under a per-app file lock, so several kpush processes may share
// a data dir. The receiver (the push pipeline and the app operations) is its user.
package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"

	"kpush.dev/kpush/internal/atomicfile"
	"kpush.dev/kpush/state/lease"
)

// ErrNoApp is returned (wrapped) for an app without state.
var ErrNoApp = errors.New("no such app")

// Store keeps app records, releases and builds as JSON files under <data>/state/apps, each
// written atomically (temp file + rename, mode 0600). Several processes may share a data dir
// (two `kpush dev` or `kpush serve` processes on one machine): every read-modify-write of an
// app's numbering, record and queue holds flock(2) on <data>/state/apps/.locks/<app>.lock,
// and each process holds flock on <data>/state/owners/<owner>.lock for as long as it lives,
// so that what a dead process left pending can be told from what a live one is running.
// Safe for concurrent use.
type Store struct {
	dir    string // <data>/state/apps
	owners string // <data>/state/owners
	owner  string
	ownerL *flock.Flock // held while this Store is open; nil once closed
}

// OpenStore opens (creating) the app state under dataDir/state/apps as a new owner (see
// Owner). Releases and builds left pending by a process that is gone are marked failed, but
// a release the Deployer had already reported live (Release.Deployed) is marked succeeded
// and made the app's current release: it is what serves.
func OpenStore(dataDir string) (*Store, error) {
	dir := filepath.Join(dataDir, "state", "apps")
	owners := filepath.Join(dataDir, "state", "owners")
	for _, d := range []string{filepath.Join(dir, ".locks"), owners} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating app state directory: %w", err)
		}
	}
	s := &Store{dir: dir, owners: owners, owner: lease.ProcessIdentity()}
	l := flock.New(filepath.Join(owners, s.owner+".lock"))
	if err := l.Lock(); err != nil {
		return nil, fmt.Errorf("locking owner lock %s: %w", l.Path(), err)
	}
	s.ownerL = l
	apps, err := s.Apps()
	if err != nil {
		return nil, err
	}
	for _, a := range apps {
		if err := s.sweep(a.Name); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// sweep marks app's pending releases and builds whose owner is gone as failed, or a release
// already deployed as succeeded and current.
func (s *Store) sweep(app string) error {
	rels, err := s.Releases(app)
	if err != nil {
		return err
	}
	for _, r := range rels {
		if r.Status != StatusPending || s.OwnerAlive(r.Owner) {
			continue
		}
		if r.Deployed {
			if err := s.recordDeployed(app, r); err != nil {
				return err
			}
			continue
		}
		r.Status, r.Reason = StatusFailed, "interrupted: the server stopped during the release"
		if err := s.PutRelease(app, r); err != nil {
			return err
		}
	}
	builds, err := s.Builds(app)
	if err != nil {
		return err
	}
	for _, b := range builds {
		if b.Status == StatusPending && !s.OwnerAlive(b.Owner) {
			b.Status, b.Finished = StatusFailed, time.Now().UTC()
			if err := s.PutBuild(app, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// recordDeployed records r, deployed by a process that died before it said so, as succeeded
// and, unless a newer release serves already, as app's current release with its config.
func (s *Store) recordDeployed(app string, r *Release) error {
	r.Status, r.Reason = StatusSucceeded, ""
	if err := s.PutRelease(app, r); err != nil {
		return err
	}
	_, err := s.UpdateApp(app, func(a *App) error {
		if a.Current < r.Version {
			a.Current = r.Version
			if r.URL != "" {
				a.URL = r.URL
			}
			a.Config = Config{Version: r.ConfigVersion, Env: CloneEnv(r.Env)}
		}
		return nil
	})
	return err
}

// Owner is this Store's process identity ("<host>_<pid>_<random>", lease.ProcessIdentity),
// recorded in the releases and builds it runs.
func (s *Store) Owner() string { return s.owner }

// OwnerAlive reports whether the process that opened the Store with owner still has it
// open. "" (records from before owners were kept) is not alive.
func (s *Store) OwnerAlive(owner string) bool {
	if owner == s.owner {
		return s.ownerL != nil
	}
	if owner == "" || strings.ContainsAny(owner, "/\\") {
		return false
	}
	l := flock.New(filepath.Join(s.owners, owner+".lock"), flock.SetFlag(os.O_RDONLY)) // not O_CREATE
	ok, err := l.TryRLock()
	if err != nil {
		return false // no lock file: its process is gone
	}
	if !ok {
		return true // its process holds it
	}
	defer l.Unlock()    //nolint:errcheck // closing drops it anyway
	os.Remove(l.Path()) // gone for good: nobody will hold it again
	return false
}

// Close gives up this Store's ownership, as a stopped process would.
func (s *Store) Close() error {
	if s.ownerL == nil {
		return nil
	}
	os.Remove(s.ownerL.Path())
	err := s.ownerL.Unlock()
	s.ownerL = nil
	return err
}

// lockApp runs f holding the exclusive flock of app's state (short read-modify-writes only).
func (s *Store) lockApp(app string, f func() error) error {
	l := flock.New(filepath.Join(s.dir, ".locks", app+".lock"))
	if err := l.Lock(); err != nil {
		return fmt.Errorf("locking state of app %s: %w", app, err)
	}
	defer l.Unlock() //nolint:errcheck // closing drops it anyway
	return f()
}

// releasePoll is how often LockRelease tries the lock while someone else holds it.
const releasePoll = 50 * time.Millisecond

// LockRelease blocks until the caller holds app's release lock, or ctx ends. The release lock
// is held while a release is planned on the app's current release, deployed and recorded, so
// that the app's current release and config change one release at a time, across processes
// sharing the data dir (flock(2) on <data>/state/apps/.locks/<app>.release; the kernel drops
// it when its process dies). note says what for; waiting, if not nil, is called once with the
// holder's note when the lock is busy.
func (s *Store) LockRelease(ctx context.Context, app, note string, waiting func(holder string)) (unlock func(), err error) {
	path := filepath.Join(s.dir, ".locks", app+".release")
	l := flock.New(path)
	ok, err := l.TryLock()
	if err == nil && !ok {
		if waiting != nil {
			b, _ := os.ReadFile(path)
			waiting(strings.TrimSpace(string(b)))
		}
		ok, err = l.TryLockContext(ctx, releasePoll)
		if !ok && ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for the release lock of app %s: %w", app, context.Cause(ctx))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("locking release lock of app %s: %w", app, err)
	}
	// The holder's note, for whoever waits next: written through the path (the lock's own
	// descriptor is read-only), removed before the lock is given up.
	os.WriteFile(path, []byte(note+"\n"), 0o600)
	return func() { os.Truncate(path, 0); l.Unlock() }, nil
}

func (s *Store) appDir(app string) string { return filepath.Join(s.dir, app) }

// BuildLog is the path of build n's output.
func (s *Store) BuildLog(app string, n int) string {
	return filepath.Join(s.appDir(app), "builds", strconv.Itoa(n)+".log")
}

// CreateApp records a new app. It fails with fs.ErrExist (wrapped) when the app has state.
func (s *Store) CreateApp(a *App) error {
	dir := s.appDir(a.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating state of app %s: %w", a.Name, err)
	}
	for _, d := range []string{"releases", "builds"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return fmt.Errorf("creating state of app %s: %w", a.Name, err)
		}
	}
	return writeJSON(filepath.Join(dir, "app.json"), a)
}

// App reads an app's record; ErrNoApp (wrapped) when there is none.
func (s *Store) App(app string) (*App, error) {
	var a App
	err := readJSON(filepath.Join(s.appDir(app), "app.json"), &a)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoApp, app)
	}
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// PutApp replaces an app's record. Use UpdateApp to change one.
func (s *Store) PutApp(a *App) error {
	return writeJSON(filepath.Join(s.appDir(a.Name), "app.json"), a)
}

// UpdateApp reads app's record, lets f change it and writes it back, holding app's state
// lock throughout, so concurrent updates (of this or another process) are never lost. f's
// error is returned unwrapped and nothing is written. It returns the record as written.
func (s *Store) UpdateApp(app string, f func(*App) error) (*App, error) {
	var a *App
	err := s.lockApp(app, func() error {
		var err error
		if a, err = s.App(app); err != nil {
			return err
		}
		if err := f(a); err != nil {
			return err
		}
		return s.PutApp(a)
	})
	return a, err
}

// Apps lists every app, sorted by name.
func (s *Store) Apps() ([]*App, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing apps: %w", err)
	}
	var out []*App
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		a, err := s.App(e.Name())
		if errors.Is(err, ErrNoApp) {
			continue // half-created or half-removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// RemoveApp deletes an app's state: record, releases, builds and their logs.
func (s *Store) RemoveApp(app string) error {
	// Rename first, so a half-removed app never looks like an app.
	tmp := filepath.Join(s.dir, ".removed-"+app+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Rename(s.appDir(app), tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing state of app %s: %w", app, err)
	}
	return os.RemoveAll(tmp)
}

// NewRelease gives r the next release number of app, stores it and returns the number. A
// pending release without an Owner gets this Store's.
func (s *Store) NewRelease(app string, r *Release) (int, error) {
	err := s.lockApp(app, func() error {
		n, err := maxNumber(filepath.Join(s.appDir(app), "releases"), "v", ".json")
		if err != nil {
			return err
		}
		r.Version = n + 1
		if r.Created.IsZero() {
			r.Created = time.Now().UTC()
		}
		if r.Status == StatusPending && r.Owner == "" {
			r.Owner = s.owner
		}
		return writeJSON(s.releasePath(app, r.Version), r)
	})
	return r.Version, err
}

func (s *Store) releasePath(app string, n int) string {
	return filepath.Join(s.appDir(app), "releases", "v"+strconv.Itoa(n)+".json")
}

// PutRelease replaces release r.Version of app.
func (s *Store) PutRelease(app string, r *Release) error {
	return writeJSON(s.releasePath(app, r.Version), r)
}

// Release reads release n of app; fs.ErrNotExist (wrapped) when there is none.
func (s *Store) Release(app string, n int) (*Release, error) {
	var r Release
	if err := readJSON(s.releasePath(app, n), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Releases lists app's releases, newest first.
func (s *Store) Releases(app string) ([]*Release, error) {
	var out []*Release
	err := readAll(filepath.Join(s.appDir(app), "releases"), func() any { return &Release{} }, func(v any) {
		out = append(out, v.(*Release))
	})
	slices.SortFunc(out, func(a, b *Release) int { return b.Version - a.Version })
	return out, err
}

// NewBuild gives b the next build number of app, stores it, creates its empty log and
// returns the number.
func (s *Store) NewBuild(app string, b *Build) (int, error) {
	err := s.lockApp(app, func() error {
		n, err := maxNumber(filepath.Join(s.appDir(app), "builds"), "", ".json")
		if err != nil {
			return err
		}
		b.Number = n + 1
		if b.Started.IsZero() {
			b.Started = time.Now().UTC()
		}
		if b.Status == StatusPending && b.Owner == "" {
			b.Owner = s.owner
		}
		if err := os.WriteFile(s.BuildLog(app, b.Number), nil, 0o600); err != nil {
			return fmt.Errorf("creating build log: %w", err)
		}
		return writeJSON(s.buildPath(app, b.Number), b)
	})
	return b.Number, err
}

func (s *Store) buildPath(app string, n int) string {
	return filepath.Join(s.appDir(app), "builds", strconv.Itoa(n)+".json")
}

// PutBuild replaces build b.Number of app.
func (s *Store) PutBuild(app string, b *Build) error { return writeJSON(s.buildPath(app, b.Number), b) }

// Build reads build n of app; fs.ErrNotExist (wrapped) when there is none.
func (s *Store) Build(app string, n int) (*Build, error) {
	var b Build
	if err := readJSON(s.buildPath(app, n), &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// Builds lists app's builds, newest first.
func (s *Store) Builds(app string) ([]*Build, error) {
	var out []*Build
	err := readAll(filepath.Join(s.appDir(app), "builds"), func() any { return &Build{} }, func(v any) {
		out = append(out, v.(*Build))
	})
	slices.SortFunc(out, func(a, b *Build) int { return b.Number - a.Number })
	return out, err
}

// maxNumber returns the largest N of files "<prefix>N<suffix>" in dir (0 when none).
func maxNumber(dir, prefix, suffix string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("listing %s: %w", dir, err)
	}
	m := 0
	for _, e := range ents {
		mid, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		mid, ok = strings.CutSuffix(mid, suffix)
		if n, err := strconv.Atoi(mid); ok && err == nil && n > m {
			m = n
		}
	}
	return m, nil
}

func readAll(dir string, alloc func() any, add func(any)) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		v := alloc()
		if err := readJSON(filepath.Join(dir, e.Name()), v); err != nil {
			return err
		}
		add(v)
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	return nil
}

// writeJSON writes v to path atomically (internal/atomicfile: fsynced, renamed over path),
// mode 0600: env values may be secrets.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// CloneEnv copies an environment, nil when it is empty.
func CloneEnv(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}
