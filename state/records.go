package state

import (
	"encoding/json"
	"strconv"
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
	// StatusCancelled: stopped on purpose (builds:cancel, apps:unlock, superseded by a newer
	// push, the pusher disconnecting with cancel-on-disconnect); Reason says by whom.
	StatusCancelled = "cancelled"
)

// Phase is what a release is doing for people: its Status, except that a pending one is
// "queued" (waiting for the app's running build), "building" or "deploying".
func (r *Release) Phase() string {
	if r.Status != StatusPending {
		return r.Status
	}
	switch {
	case r.DeployAttempted || !(r.Kind == KindPush || r.Kind == KindRebuild):
		return "deploying"
	case r.Build > 0:
		return "building"
	default:
		return "queued"
	}
}

// Phase is what a build is doing for people: its Status, "building" while it runs.
func (b *Build) Phase() string {
	if b.Status == StatusPending {
		return "building"
	}
	return b.Status
}

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
	// Base is the release this one was planned on: the app's current release when its deploy
	// was planned (0: none). Its image and env are what the deploy expected to find in the
	// Service; a field someone else changed since is not overwritten.
	Base int `json:"base,omitempty"`
	// DeployAttempted is set once the release was handed to the Deployer: a failed release
	// with it may have written the Service (e.g. a Knative Service that never became Ready).
	DeployAttempted bool `json:"deploy_attempted,omitempty"`
	// Deployed is set, with URL, once the Deployer reported the release live, before it is
	// recorded as succeeded and the app's current release: a kpush killed in between left it
	// serving, and the next start records it so (OpenStore) rather than as interrupted.
	Deployed bool   `json:"deployed,omitempty"`
	URL      string `json:"url,omitempty"`
	PushID   string `json:"push_id,omitempty"` // the push that caused it, for the server log
	// Owner is the kpush process (Store.Owner) that runs the release while it is pending; a
	// pending release whose owner died counts as interrupted. Stored and shown as "server"
	// (records written before are read from "owner"), not to be confused with App.Owner.
	Owner string `json:"server,omitempty"`
}

// UnmarshalJSON reads a release, taking its Owner from "owner" in records written before
// it was named "server".
func (r *Release) UnmarshalJSON(b []byte) error {
	type plain Release
	var v struct {
		plain
		Legacy string `json:"owner"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Release(v.plain)
	if r.Owner == "" {
		r.Owner = v.Legacy
	}
	return nil
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
	Owner    string    `json:"server,omitempty"` // the kpush process running it (Release.Owner)
	// Env is the app's build env (build-env:set values) the build ran with, kept so that they
	// stay redacted from what readers see after they were changed or unset (project.toml's
	// values are in the repository, readable anyway). Admins only; the record is 0600 like
	// every state file.
	Env map[string]string `json:"env,omitempty"`
}

// UnmarshalJSON reads a build, taking its Owner from "owner" in records written before it
// was named "server".
func (b *Build) UnmarshalJSON(data []byte) error {
	type plain Build
	var v struct {
		plain
		Legacy string `json:"owner"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*b = Build(v.plain)
	if b.Owner == "" {
		b.Owner = v.Legacy
	}
	return nil
}
