package receiver

import "kpush.dev/kpush/state"

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
