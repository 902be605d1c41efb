package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/internal/ops"
	"kpush.dev/kpush/state/lease"
)

// How operations of one app share it (issue 4: concurrent pushes and config changes never
// clobber each other):
//
//   - The build lease (Pipeline.Leases, named after the app) is held by one push or rebuild
//     from the moment it leaves the queue until git has applied its ref update. At most one
//     more waits for it, recorded in the app's queue (Store.Enqueue); a newer arrival
//     replaces the waiter, which gives up with "superseded by vN".
//   - The release lock (Store.LockRelease) is held only while a release is planned on the
//     app's current release, deployed and recorded. Config changes and rollbacks take only
//     this one, so they never wait for a build.
//   - A build that finishes when a newer image-changing release (push, rebuild, rollback)
//     exists is not deployed (supersededError), so only the newest arrival deploys.
//   - Every deploy is planned on the current release (Release.Base) and, when the Deployer
//     can (deployer.BaseDeployer), writes only the fields it changes, refusing with
//     deployer.ErrFieldConflict when someone else changed one of them since.

// supersededError says that a newer release made this one pointless.
type supersededError struct {
	Version      int
	Commit, User string
}

func (e *supersededError) Error() string {
	if e.Commit == "" {
		return fmt.Sprintf("superseded by v%d by %s", e.Version, e.User)
	}
	return fmt.Sprintf("superseded by v%d (%s by %s)", e.Version, short(e.Commit), e.User)
}

// supersededFailure is deployRelease's error for a release it did not deploy because a newer
// one exists: the failure reason for people, wrapping the *supersededError.
type supersededFailure struct {
	reason error
	se     *supersededError
}

func (e *supersededFailure) Error() string { return e.reason.Error() }
func (e *supersededFailure) Unwrap() error { return e.se }

// changesImage reports whether a release of kind replaces the app's image: only the newest
// of those deploys.
func changesImage(kind string) bool {
	return kind == KindPush || kind == KindRebuild || kind == KindRollback
}

// newerImageRelease returns the newest image-changing release of app after version v that
// is running, queued or done (not failed), nil when there is none. A pending release whose
// process died is marked failed on the way.
func (p *Pipeline) newerImageRelease(app string, v int) (*Release, error) {
	rels, err := p.Store.Releases(app)
	if err != nil {
		return nil, err
	}
	for _, r := range rels { // newest first
		if r.Version <= v {
			break
		}
		if !changesImage(r.Kind) || r.Status == StatusFailed {
			continue
		}
		if r.Status == StatusPending && !r.Deployed && !p.Store.OwnerAlive(r.Owner) {
			r.Status, r.Reason = StatusFailed, "interrupted: the server stopped during the release"
			if err := p.Store.PutRelease(app, r); err != nil {
				return nil, err
			}
			continue
		}
		return r, nil
	}
	return nil, nil
}

func (p *Pipeline) leases() lease.Locker {
	p.leaseOnce.Do(func() {
		if p.Leases == nil {
			p.Leases = lease.NewLocal(lease.WithLogger(p.logger()))
		}
	})
	return p.Leases
}

// leaseNote is the lease note of a build of rel; parseLeaseNote reads it back.
func leaseNote(rel *Release) string {
	return fmt.Sprintf("v%d by %s, %s", rel.Version, rel.User, short(rel.Commit))
}

func parseLeaseNote(note string) (version int, ok bool) {
	_, err := fmt.Sscanf(note, "v%d by ", &version)
	return version, err == nil
}

// describeHolder names the build holding an app's lease for people:
// "build #3 by alice, abc1234, running 35 s".
func (p *Pipeline) describeHolder(app string, h lease.Info) string {
	running := time.Since(h.Acquired).Truncate(time.Second).Seconds()
	if v, ok := parseLeaseNote(h.Note); ok {
		if r, err := p.Store.Release(app, v); err == nil {
			what := fmt.Sprintf("release v%d", v)
			if r.Build > 0 {
				what = fmt.Sprintf("build #%d", r.Build)
			}
			return fmt.Sprintf("%s by %s, %s, running %.0f s", what, r.User, short(r.Commit), running)
		}
	}
	if h.Note == "" {
		return fmt.Sprintf("%s, running %.0f s", h.Holder, running)
	}
	return fmt.Sprintf("%s, running %.0f s", h.Note, running)
}

// holderMessage describes the build holding an app's lease for people waiting behind it,
// with when the lease lapses should its holder have died: "build #3 by alice, abc1234,
// running 35 s; its lease expires in 12 s unless renewed; if it is stuck, an admin can run:
// ssh -p 2222 git@127.0.0.1 apps:unlock demo".
func (p *Pipeline) holderMessage(app string, h lease.Info) string {
	msg := p.describeHolder(app, h)
	if exp := h.ExpiresAt(); !exp.IsZero() {
		msg += fmt.Sprintf("; its lease expires in %.0f s unless renewed", max(0, time.Until(exp).Round(time.Second).Seconds()))
	}
	return msg + fmt.Sprintf("; if it is stuck, an admin can run: %s apps:unlock %s", p.sshHint(), app)
}

// sshHint is how people reach the server: "ssh -p 2222 git@127.0.0.1" (the gitserver.Hint
// of Addr).
func (p *Pipeline) sshHint() string { return gitserver.NewHint(p.Addr, "").Command() }

// holdBuild queues rel (stored, pending) for app's build lease and returns the lease once
// held. It fails with a *supersededError when a newer push replaced rel in the queue or took
// the lease before it, or
// with ctx's cause when ctx ends first (the pusher went away): rel then leaves the queue.
// While it waits it tells out what it waits for.
func (p *Pipeline) holdBuild(ctx context.Context, log *slog.Logger, app string, rel *Release, out io.Writer) (*lease.Lease, error) {
	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	queueChanged := p.Store.Changes(wctx, app) // before queueing: a newer push may replace this one at once
	newer, err := p.Store.Enqueue(app, QueueEntry{Release: rel.Version, PushID: rel.PushID, User: rel.User,
		Commit: rel.Commit, Since: time.Now().UTC(), Owner: p.Store.Owner()})
	if err != nil {
		p.Metrics.Failure(ops.StageInternal)
		return nil, fmt.Errorf("queueing: %w", err)
	}
	if newer != nil {
		return nil, &supersededError{Version: newer.Release, Commit: newer.Commit, User: newer.User}
	}
	defer p.Metrics.Queued(app)()
	defer func() {
		if err := p.Store.Dequeue(app, rel.Version); err != nil {
			log.Error("leaving the queue", "err", err)
		}
	}()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		l   *lease.Lease
		err error
	}
	done := make(chan result, 1)
	held := make(chan lease.Info, 8)
	go func() {
		l, err := p.leases().Acquire(actx, app, leaseNote(rel), func(h lease.Info) {
			select {
			case held <- h:
			default:
			}
		})
		done <- result{l, err}
	}()
	for {
		select {
		case r := <-done:
			var se *supersededError
			if errors.As(context.Cause(actx), &se) {
				if r.l != nil {
					r.l.Release(context.WithoutCancel(ctx))
				}
				return nil, se
			}
			if r.err != nil {
				if c := context.Cause(ctx); c != nil {
					return nil, c
				}
				return nil, r.err
			}
			return r.l, nil
		case h := <-held:
			v, ok := parseLeaseNote(h.Note)
			if ok && v > rel.Version {
				// A newer push took the lease while this one waited (it left the queue as it
				// did): this one could never be deployed after it.
				se := &supersededError{Version: v}
				if r, err := p.Store.Release(app, v); err == nil {
					se.Commit, se.User = r.Commit, r.User
				}
				cancel(se)
				continue
			}
			fmt.Fprintf(out, "-----> v%d queued behind %s\n", rel.Version, p.holderMessage(app, h))
			if ok && v < rel.Version {
				fmt.Fprintf(out, "       v%d would not be deployed after this newer push: its build is cancelled (a deploy in progress finishes)\n", v)
			}
			fmt.Fprintf(out, "       a newer push would replace this one in the queue\n")
		case <-queueChanged:
			q, err := p.Store.Queued(app)
			if err != nil {
				log.Warn("reading the queue", "err", err)
				continue
			}
			if q != nil && q.Release > rel.Version {
				cancel(&supersededError{Version: q.Release, Commit: q.Commit, User: q.User})
			}
		}
	}
}

// releasePlan fills rel (stored, pending) from the app's state under the release lock: a is
// the app as it is now, cur its current release (nil: none). It may refuse with an error
// for people; nothing is deployed then.
type releasePlan func(a *App, cur *Release) error

// deployRelease takes app's release lock, refuses rel if it is an image-changing release
// and a newer one exists (*supersededError), plans it on the current release, deploys it and
// records how it ended: on success rel becomes the app's current release and its config the
// app's config. logw, if not nil, is the build log alone (out already reaches it): a failure
// reason goes there too. Everything is written before the release is recorded as decided, so
// that builds:output -f, which stops then, sees it all. The returned error is for people.
func (p *Pipeline) deployRelease(ctx context.Context, log *slog.Logger, app string, rel *Release, start time.Time, out, logw io.Writer, plan releasePlan) error {
	end := p.Inflight.Begin()
	defer end()
	unlock, err := p.Store.LockRelease(ctx, app, fmt.Sprintf("v%d %s by %s", rel.Version, rel.Description, rel.User), func(holder string) {
		fmt.Fprintf(out, "-----> Waiting for the release in progress (%s)\n", holder)
	})
	if err != nil {
		log.Error("taking the release lock", "err", err)
		if ctx.Err() == nil {
			p.Metrics.Failure(ops.StageInternal)
		}
		return p.fail(log, app, rel, nil, logw, fmt.Sprintf("gave up waiting for the app's release in progress: %v", context.Cause(ctx)))
	}
	defer unlock()
	if changesImage(rel.Kind) {
		newer, err := p.newerImageRelease(app, rel.Version)
		if err != nil {
			log.Error("reading releases", "err", err)
			p.Metrics.Failure(ops.StageInternal)
			return p.fail(log, app, rel, nil, logw, "cannot read the app's releases")
		}
		if newer != nil {
			se := &supersededError{Version: newer.Version, Commit: newer.Commit, User: newer.User}
			log.Info("superseded, not deploying", "by", newer.Version)
			return &supersededFailure{p.fail(log, app, rel, nil, logw, fmt.Sprintf("v%d not deployed: %v", rel.Version, se)), se}
		}
	}
	a, err := p.Store.App(app)
	if err != nil {
		log.Error("reading app", "err", err)
		p.Metrics.Failure(ops.StageInternal)
		return p.fail(log, app, rel, nil, logw, "cannot read the app's state")
	}
	var cur *Release
	if a.Current > 0 {
		if cur, err = p.Store.Release(app, a.Current); err != nil {
			log.Error("reading the current release", "err", err)
			p.Metrics.Failure(ops.StageInternal)
			return p.fail(log, app, rel, nil, logw, "cannot read the app's current release")
		}
	}
	if err := plan(a, cur); err != nil {
		return p.fail(log, app, rel, nil, logw, err.Error())
	}
	if cur != nil {
		rel.Base = cur.Version
	}
	rel.DeployAttempted = true
	if err := p.Store.PutRelease(app, rel); err != nil {
		log.Error("recording release", "err", err)
	}
	fmt.Fprintf(out, "-----> Deploying %s\n", rel.Image)
	dstart := time.Now()
	url, err := p.deployFrom(ctx, log, app, cur, rel, indent(out))
	dres := ops.ResultOf(ctx, err)
	p.Metrics.DeployFinished(dres, time.Since(dstart))
	if err != nil {
		if dres == ops.ResultFailed {
			p.Metrics.Failure(ops.StageDeploy)
		}
		log.Error("deploy failed", "err", err)
		msg := fmt.Sprintf("deploy failed: %v", err)
		if cur != nil { // a first deploy has no previous release
			msg += "\n !     the previous release keeps serving"
		}
		if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
			msg = fmt.Sprintf("deploy stopped: %v", c)
			if isCancelled(c) {
				return p.failAs(log, app, rel, nil, logw, StatusCancelled, msg)
			}
		}
		return p.fail(log, app, rel, nil, logw, msg)
	}
	// Recorded before anything is printed: a kpush killed from here on left rel serving, and
	// its next start records it as succeeded and current (state.OpenStore), as the pusher is
	// about to be told.
	rel.Deployed, rel.URL = true, url
	if err := p.Store.PutRelease(app, rel); err != nil {
		log.Error("recording release", "err", err)
	}
	log.Info("released", "url", url, "duration", time.Since(start), "base", rel.Base)
	fmt.Fprintf(out, "-----> Released %s v%d (%s) in %s\n", app, rel.Version, short(rel.Commit), time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(out, "       %s\n", url)
	// The app first, the release's status last: a kpush killed in between left rel pending
	// and deployed, which its next start records as succeeded (state.OpenStore); the other
	// way round it would be succeeded but never the app's current release.
	if _, err := p.Store.UpdateApp(app, func(a *App) error {
		a.Current, a.URL = rel.Version, url
		a.Config = Config{Version: rel.ConfigVersion, Env: cloneEnv(rel.Env)}
		return nil
	}); err != nil {
		log.Error("recording app", "err", err)
	}
	rel.Status = StatusSucceeded
	if err := p.Store.PutRelease(app, rel); err != nil {
		log.Error("recording release", "err", err)
	}
	return nil
}

// deployFrom deploys rel planned on cur. With a Deployer that takes a base
// (deployer.BaseDeployer), the base is cur; if one of rel's fields conflicts with it
// (deployer.ErrFieldConflict), the releases kpush tried to deploy after cur and that failed (a
// Service written but never Ready) are tried as the base in turn, newest first: their write
// is kpush's own, not someone else's. Each try writes nothing unless its base matches.
func (p *Pipeline) deployFrom(ctx context.Context, log *slog.Logger, app string, cur, rel *Release, out io.Writer) (string, error) {
	r := deployer.Release{App: app, Image: rel.Image, Commit: rel.Commit, Pusher: rel.User, Env: cloneEnv(rel.Env), Version: rel.Version}
	bd, ok := p.Deployer.(deployer.BaseDeployer)
	if !ok {
		return p.Deployer.Deploy(ctx, r, out)
	}
	bases := []deployer.Release{asDeployed(app, cur)}
	if rels, err := p.Store.Releases(app); err == nil {
		for _, f := range rels {
			if f.Version < rel.Version && (cur == nil || f.Version > cur.Version) && f.Status == StatusFailed && f.DeployAttempted && f.Image != "" {
				bases = append(bases, asDeployed(app, f))
			}
		}
	}
	var first error
	for i, base := range bases {
		url, err := bd.DeployFrom(ctx, base, r, out)
		if err == nil || !errors.Is(err, deployer.ErrFieldConflict) {
			return url, err
		}
		if i == 0 {
			first = err
		}
		log.Info("field conflict against the planned base; trying the next", "base", base.Version, "err", err)
	}
	return "", first
}

func asDeployed(app string, r *Release) deployer.Release {
	if r == nil {
		return deployer.Release{}
	}
	return deployer.Release{App: app, Image: r.Image, Commit: r.Commit, Pusher: r.User, Env: cloneEnv(r.Env), Version: r.Version}
}

// cancelledError is the cause of a build stopped on purpose: builds:cancel, apps:unlock, a
// newer push queued behind it (se set), the pusher disconnecting. Its release and build are
// recorded as StatusCancelled.
type cancelledError struct {
	msg string
	se  *supersededError // the queued release that made this build pointless, if that is why
}

func (e *cancelledError) Error() string { return e.msg }

// Unwrap returns the *supersededError, if any, so that errors.As finds it.
func (e *cancelledError) Unwrap() error {
	if e.se == nil {
		return nil
	}
	return e.se
}

// isCancelled reports whether err (or ctx's cause) says the operation was cancelled on purpose.
func isCancelled(err error) bool {
	_, ok := errors.AsType[*cancelledError](err)
	return ok
}

// watchBuild cancels the build context (cancel) when the build lease is lost (apps:unlock
// names who ran it), when builds:cancel asks for it, while building (building reports true)
// when a newer push or rebuild queues behind rel (it would not be deployed: see
// deployRelease), or — with cancelOnDisconnect — when the pusher disconnects (pusher ends).
// Every cause is a *cancelledError. It returns when done is closed.
func (p *Pipeline) watchBuild(app string, rel *Release, l *lease.Lease, pusher context.Context, cancelOnDisconnect bool, building func() bool, cancel context.CancelCauseFunc, done <-chan struct{}) {
	wctx, stopWatching := context.WithCancel(context.Background())
	defer stopWatching()
	changed := p.Store.Changes(wctx, app)
	var gone <-chan struct{}
	if cancelOnDisconnect {
		gone = pusher.Done()
	}
	var lost <-chan struct{}
	if l != nil {
		lost = l.Lost()
	}
	requested := func() error {
		c := p.Store.CancelRequested(app, rel.Version)
		switch {
		case c == nil:
			return nil
		case c.Via == "apps:unlock":
			return &cancelledError{msg: fmt.Sprintf("cancelled: %s ran apps:unlock %s", c.User, app)}
		default:
			return &cancelledError{msg: fmt.Sprintf("cancelled by %s (builds:cancel)", c.User)}
		}
	}
	check := func() bool { // reports whether it cancelled
		if err := requested(); err != nil {
			cancel(err)
			return true
		}
		if building == nil || !building() {
			return false
		}
		if q, err := p.Store.Queued(app); err == nil && q != nil && q.Release > rel.Version {
			se := &supersededError{Version: q.Release, Commit: q.Commit, User: q.User}
			p.logger().Info("newer push queued; cancelling the doomed build", "app", app, "release", rel.Version, "by", q.Release)
			cancel(&cancelledError{se: se, msg: fmt.Sprintf("v%d not deployed: %v; its build was cancelled when v%d queued behind it",
				rel.Version, se, q.Release)})
			return true
		}
		return false
	}
	if check() { // what was asked before the watch began
		return
	}
	for {
		select {
		case <-done:
			return
		case <-lost:
			if err := requested(); err != nil {
				cancel(err)
				return
			}
			cancel(&cancelledError{msg: fmt.Sprintf("cancelled: this server lost the app's lease (%v); the build may run elsewhere now", l.Err())})
			return
		case <-gone:
			cancel(&cancelledError{msg: "cancelled: the pusher disconnected (push option cancel-on-disconnect)"})
			return
		case <-changed:
			if check() {
				return
			}
		}
	}
}
