package receiver

import (
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
	"sync"
	"time"
)

// Release kinds: what caused a release.
const (
	KindPush     = "push"     // a git push to the deploy branch
	KindConfig   = "config"   // config:set / config:unset: the current image with new env
	KindRollback = "rollback" // rollback APP vN: vN's image and config
	KindRebuild  = "rebuild"  // rebuild APP [REV]: a build without a push
)

// Release and build statuses.
const (
	StatusPending   = "pending"   // building or deploying
	StatusSucceeded = "succeeded" // serving (or served) traffic
	StatusFailed    = "failed"    // Reason says why; the previous release kept serving
)

// App is an app's record, <data>/state/apps/<app>/app.json.
type App struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Owner   string    `json:"owner"` // the user who created it
	// DeployBranch is the branch whose pushes deploy ("main"), known after the first push
	// (gitserver points HEAD at the first branch pushed); empty before.
	DeployBranch string            `json:"deploy_branch,omitempty"`
	Config       Config            `json:"config"`
	BuildEnv     map[string]string `json:"build_env,omitempty"` // build-time env for the next builds
	Current      int               `json:"current,omitempty"`   // the release serving now; 0: none yet
	URL          string            `json:"url,omitempty"`       // where the current release serves
}

// Config is an app's run-time environment. Version counts its changes from 0 (empty).
type Config struct {
	Version int               `json:"version"`
	Env     map[string]string `json:"env,omitempty"`
}

// Release is one deploy attempt "v<Version>", <data>/state/apps/<app>/releases/v<N>.json.
type Release struct {
	Version       int               `json:"version"`
	Kind          string            `json:"kind"` // KindPush, KindConfig, KindRollback, KindRebuild
	Description   string            `json:"description"`
	Commit        string            `json:"commit,omitempty"` // 40-hex; its source is kept at refs/kpush/releases/v<N>
	Image         string            `json:"image,omitempty"`  // by digest; empty when the build failed
	ConfigVersion int               `json:"config_version"`
	Env           map[string]string `json:"env,omitempty"`   // the run-time env it was deployed with
	Build         int               `json:"build,omitempty"` // build number; 0 for config and rollback releases
	User          string            `json:"user"`            // who caused it
	Created       time.Time         `json:"created"`
	Status        string            `json:"status"`           // StatusPending, StatusSucceeded, StatusFailed
	Reason        string            `json:"reason,omitempty"` // why it failed
}

// Ref is the immutable ref that keeps the release's source: "refs/kpush/releases/v<N>".
func (r *Release) Ref() string { return ReleaseRef(r.Version) }

// ReleaseRef is "refs/kpush/releases/v<n>".
func ReleaseRef(n int) string { return "refs/kpush/releases/v" + strconv.Itoa(n) }

// Build is one build "#<Number>", <data>/state/apps/<app>/builds/<N>.json; its output is in
// builds/<N>.log.
type Build struct {
	Number   int       `json:"number"`
	Commit   string    `json:"commit"`
	Release  int       `json:"release"`
	User     string    `json:"user"`
	Status   string    `json:"status"` // StatusPending while it runs
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
}

// ErrNoApp is returned (wrapped) for an app without state.
var ErrNoApp = errors.New("no such app")

// Store keeps app records, releases and builds as JSON files under <data>/state/apps, each
// written atomically (temp file + rename, mode 0600). One process owns a data dir. Safe for
// concurrent use; numbering is serialised per Store.
type Store struct {
	dir string // <data>/state/apps

	mu sync.Mutex
}

// OpenStore opens (creating) the app state under dataDir/state/apps. Releases and builds
// left pending by a previous process that stopped mid-build are marked failed.
func OpenStore(dataDir string) (*Store, error) {
	dir := filepath.Join(dataDir, "state", "apps")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating app state directory: %w", err)
	}
	s := &Store{dir: dir}
	apps, err := s.Apps()
	if err != nil {
		return nil, err
	}
	for _, a := range apps {
		rels, err := s.Releases(a.Name)
		if err != nil {
			return nil, err
		}
		for _, r := range rels {
			if r.Status == StatusPending {
				r.Status, r.Reason = StatusFailed, "interrupted: the server stopped during the release"
				if err := s.PutRelease(a.Name, r); err != nil {
					return nil, err
				}
			}
		}
		builds, err := s.Builds(a.Name)
		if err != nil {
			return nil, err
		}
		for _, b := range builds {
			if b.Status == StatusPending {
				b.Status = StatusFailed
				if err := s.PutBuild(a.Name, b); err != nil {
					return nil, err
				}
			}
		}
	}
	return s, nil
}

func (s *Store) appDir(app string) string { return filepath.Join(s.dir, app) }

// BuildLog is the path of build n's output.
func (s *Store) BuildLog(app string, n int) string {
	return filepath.Join(s.appDir(app), "builds", strconv.Itoa(n)+".log")
}

// CreateApp records a new app. It fails with fs.ErrExist (wrapped) when the app has state.
func (s *Store) CreateApp(a *App) error {
	s.mu.Lock()
	defer s.mu.Unlock()
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

// PutApp replaces an app's record.
func (s *Store) PutApp(a *App) error {
	return writeJSON(filepath.Join(s.appDir(a.Name), "app.json"), a)
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
	s.mu.Lock()
	defer s.mu.Unlock()
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

// NewRelease gives r the next release number of app, stores it and returns the number.
func (s *Store) NewRelease(app string, r *Release) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := maxNumber(filepath.Join(s.appDir(app), "releases"), "v", ".json")
	if err != nil {
		return 0, err
	}
	r.Version = n + 1
	if r.Created.IsZero() {
		r.Created = time.Now().UTC()
	}
	return r.Version, writeJSON(s.releasePath(app, r.Version), r)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := maxNumber(filepath.Join(s.appDir(app), "builds"), "", ".json")
	if err != nil {
		return 0, err
	}
	b.Number = n + 1
	if b.Started.IsZero() {
		b.Started = time.Now().UTC()
	}
	if err := os.WriteFile(s.BuildLog(app, b.Number), nil, 0o600); err != nil {
		return 0, fmt.Errorf("creating build log: %w", err)
	}
	return b.Number, writeJSON(s.buildPath(app, b.Number), b)
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

// writeJSON writes v to path atomically: a temp file beside it (0600: env values may be
// secrets), fsynced, renamed over path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// cloneEnv copies m (nil for an empty map).
func cloneEnv(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}
