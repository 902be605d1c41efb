package receiver

import (
	"context"

	"kpush.dev/kpush/state"
)

// The app state the pipeline keeps lives in package state; these are its names as the
// receiver's callers have always used them.
type (
	App           = state.App
	Config        = state.Config
	Release       = state.Release
	Build         = state.Build
	QueueEntry    = state.QueueEntry
	CancelRequest = state.CancelRequest
	Store         = state.Store
)

// Release kinds and release and build statuses (state's).
const (
	KindPush     = state.KindPush
	KindConfig   = state.KindConfig
	KindRollback = state.KindRollback
	KindRebuild  = state.KindRebuild

	StatusPending   = state.StatusPending
	StatusSucceeded = state.StatusSucceeded
	StatusFailed    = state.StatusFailed
	StatusCancelled = state.StatusCancelled
)

var (
	// OpenStore opens the app state under a data dir (state.OpenStore).
	OpenStore = state.OpenStore
	// ReleaseRef is "refs/kpush/releases/v<n>" (state.ReleaseRef).
	ReleaseRef = state.ReleaseRef
	// ErrNoApp is returned (wrapped) for an app without state.
	ErrNoApp = state.ErrNoApp
)

func cloneEnv(m map[string]string) map[string]string { return state.CloneEnv(m) }

// AppState is the app state the pipeline reads and writes; *state.Store implements it, for
// every process sharing a data dir.
type AppState interface {
	Apps
	Releases
	Builds
	BuildQueue
}

// Apps are the app records.
type Apps interface {
	CreateApp(a *App) error
	App(app string) (*App, error)
	Apps() ([]*App, error)
	UpdateApp(app string, f func(*App) error) (*App, error)
	RemoveApp(app string) error
}

// Releases are an app's releases, numbered from 1, and the lock a release is deployed under.
type Releases interface {
	NewRelease(app string, r *Release) (int, error)
	PutRelease(app string, r *Release) error
	Release(app string, n int) (*Release, error)
	Releases(app string) ([]*Release, error)
	LockRelease(ctx context.Context, app, note string, waiting func(holder string)) (unlock func(), err error)
}

// Builds are an app's builds, numbered from 1, and their logs.
type Builds interface {
	NewBuild(app string, b *Build) (int, error)
	PutBuild(app string, b *Build) error
	Build(app string, n int) (*Build, error)
	Builds(app string) ([]*Build, error)
	BuildLog(app string, n int) string
}

// BuildQueue is the one push waiting per app, cancel requests, and who (which process) waits
// or builds.
type BuildQueue interface {
	Enqueue(app string, e QueueEntry) (newer *QueueEntry, err error)
	Queued(app string) (*QueueEntry, error)
	Dequeue(app string, release int) error
	RequestCancel(app string, c CancelRequest) error
	CancelRequested(app string, n int) *CancelRequest
	// Changes wakes its receiver when app's queue or cancel request may have changed.
	Changes(ctx context.Context, app string) <-chan struct{}
	Owner() string
	OwnerAlive(owner string) bool
}

var _ AppState = (*state.Store)(nil)
