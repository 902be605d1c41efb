package receiver

import (
	"context"
	"errors"

	"kpush.dev/kpush/gitserver"
)

// The app operations behind the SSH commands, one verb per file: apps (create, info, list),
// config, releases, rollback, rebuild, destroy, builds (list, output, cancel, unlock) and
// leftovers. Rebuilds queue for the app's build lease like pushes; config changes and
// rollbacks take only the release lock (see coord.go), so they never wait for a build and
// land beside it. Their errors are sentences for people (errors.go); internal detail goes to
// the log.

// AppInfo is what apps:info shows.
type AppInfo struct {
	*App
	Release *Release `json:"release,omitempty"` // the current release
	Latest  *Release `json:"latest,omitempty"`  // the newest release, when it is not the current one
	Status  string   `json:"status"`            // "deployed", "not deployed", "queued", "building", "deploying", "last release failed", "last release cancelled"
}

// App returns app's record, or an error for people when it does not exist.
func (p *Pipeline) App(app string) (*App, error) {
	if err := gitserver.ValidAppName(app); err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	a, err := p.Store.App(app)
	if errors.Is(err, ErrNoApp) {
		return nil, userErrorf("app %s does not exist; create it with %s apps:create %s or a git push", app, p.sshHint(), app)
	}
	if err != nil {
		return nil, p.internal(app, "reading the app", err)
	}
	return a, nil
}

// Apps lists every app, sorted by name.
func (p *Pipeline) Apps() ([]*App, error) {
	apps, err := p.Store.Apps()
	if err != nil {
		return nil, p.internal("", "listing apps", err)
	}
	return apps, nil
}

// Create makes an empty app: its repository and its record, with user as its admin.
func (p *Pipeline) Create(ctx context.Context, app, user string) (*App, error) {
	if err := gitserver.ValidAppName(app); err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	unlock, err := p.Store.LockRelease(ctx, app, "apps:create by "+user, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := p.Store.App(app); err == nil {
		return nil, userErrorf("app %s already exists", app)
	}
	if p.Repos != nil {
		if _, ok := p.Repos.RepoDir(app); ok {
			return nil, userErrorf("app %s already exists (it has a repository)", app)
		}
		if _, err := p.Repos.CreateRepo(ctx, app); err != nil {
			return nil, p.internal(app, "creating the repository", err)
		}
	}
	a, err := p.ensureApp(app, user, "", true)
	if err != nil {
		if p.Repos != nil {
			if derr := p.Repos.DeleteRepo(app); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return nil, p.internal(app, "recording the app", err)
	}
	return a, nil
}

// Info returns app's record with its current and newest releases.
func (p *Pipeline) Info(app string) (*AppInfo, error) {
	a, err := p.App(app)
	if err != nil {
		return nil, err
	}
	rels, err := p.Store.Releases(app)
	if err != nil {
		return nil, p.internal(app, "reading releases", err)
	}
	info := &AppInfo{App: a, Status: "not deployed"}
	for _, r := range rels {
		if r.Version == a.Current {
			info.Release = r
		}
	}
	if a.Current > 0 {
		info.Status = "deployed"
	}
	if len(rels) > 0 && rels[0].Version != a.Current {
		info.Latest = rels[0]
		switch rels[0].Status {
		case StatusPending:
			info.Status = rels[0].Phase() // queued, building, deploying
		case StatusFailed:
			info.Status = "last release failed"
		case StatusCancelled:
			info.Status = "last release cancelled"
		}
	}
	return info, nil
}

// repository is app's git repository, if it has one.
func (p *Pipeline) repository(app string) (*gitserver.Repository, bool) {
	if p.Repos == nil {
		return nil, false
	}
	dir, ok := p.Repos.RepoDir(app)
	if !ok {
		return nil, false
	}
	repo, err := gitserver.OpenRepository(dir)
	if err != nil {
		p.logger().Error("opening the app's repository", "app", app, "err", err)
		return nil, false
	}
	return repo, true
}

var _ gitserver.AppRecorder = (*Pipeline)(nil)

// UnlessRecorded calls drop unless app has a record, holding the app's release lock, which
// Create holds from making the repository to recording the app: the git server removes
// through it the empty repository and grants of a first push that ended without creating the
// app, and must not remove those of an apps:create in its middle.
func (p *Pipeline) UnlessRecorded(ctx context.Context, app string, drop func() error) (bool, error) {
	unlock, err := p.Store.LockRelease(ctx, app, "removing the empty repository of an app never created", nil)
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, err := p.Store.App(app); !errors.Is(err, ErrNoApp) {
		return false, err
	}
	return true, drop()
}
