package receiver

import (
	"context"
	"io"
	"os"
	"time"

	"kpush.dev/kpush/state/lease"
)

// Builds lists app's builds, newest first.
func (p *Pipeline) Builds(app string) ([]*Build, error) {
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	bs, err := p.Store.Builds(app)
	if err != nil {
		return nil, p.internal(app, "reading builds", err)
	}
	return bs, nil
}

// followPoll is how often BuildOutput looks for more output of a running build.
const followPoll = 200 * time.Millisecond

// BuildOutput writes build n's log to w (n = 0: the newest build). With follow, it keeps
// writing what a running build adds until its release is decided (the log ends with the
// deploy's output) or ctx ends.
func (p *Pipeline) BuildOutput(ctx context.Context, app string, n int, follow bool, w io.Writer) error {
	bs, err := p.Builds(app)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		return userErrorf("app %s has no builds yet", app)
	}
	if n == 0 {
		n = bs[0].Number
	}
	if _, err := p.Store.Build(app, n); err != nil {
		return userErrorf("app %s has no build #%d; list them with: %s builds %s", app, n, p.sshHint(), app)
	}
	f, err := os.Open(p.Store.BuildLog(app, n))
	if err != nil {
		return p.internal(app, "reading the build log", err)
	}
	defer f.Close()
	for {
		// Read the status before draining, so output written before the build ended is
		// never missed.
		b, err := p.Store.Build(app, n)
		if err != nil {
			return p.internal(app, "reading the build", err)
		}
		if _, err := io.Copy(w, f); err != nil {
			return nil // the reader went away
		}
		if !follow || !p.logOpen(app, b) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followPoll):
		}
	}
}

// logOpen reports whether build b's log may still grow: the build or its release is pending.
func (p *Pipeline) logOpen(app string, b *Build) bool {
	if b.Status == StatusPending {
		return true
	}
	r, err := p.Store.Release(app, b.Release)
	return err == nil && r.Status == StatusPending
}

// CancelBuild asks the running build of app to stop (builds:cancel), wherever it runs: the
// process holding the app's lease sees the request within a second. It returns the release
// whose build it cancels.
func (p *Pipeline) CancelBuild(ctx context.Context, app, user string) (*Release, error) {
	if _, err := p.App(app); err != nil {
		return nil, err
	}
	h, held, err := p.leases().Holder(ctx, app)
	if err != nil {
		return nil, p.internal(app, "reading the app's lease", err)
	}
	v, ok := parseLeaseNote(h.Note)
	if !held || !ok {
		return nil, userErrorf("no build of %s is running", app)
	}
	r, err := p.Store.Release(app, v)
	if err != nil {
		return nil, p.internal(app, "reading the running release", err)
	}
	if err := p.Store.RequestCancel(app, CancelRequest{Release: v, User: user, At: time.Now().UTC(), Via: "builds:cancel"}); err != nil {
		return nil, p.internal(app, "recording the cancel request", err)
	}
	return r, nil
}

// LeaseInfo is who holds an app's build lease, for apps:unlock.
type LeaseInfo = lease.Info

// Unlock frees app's build lease whoever holds it (apps:unlock, run by user) and empties its
// queue entry if the waiter's process is gone. It returns the lease as it was, whether it was
// held, and the holder described for people (holderMessage). The holder, if alive, learns
// at its next renewal and cancels its build, telling its pusher that user ran apps:unlock.
func (p *Pipeline) Unlock(ctx context.Context, app, user string) (LeaseInfo, bool, string, error) {
	if _, err := p.App(app); err != nil {
		return LeaseInfo{}, false, "", err
	}
	h, held, err := p.leases().Holder(ctx, app)
	if err != nil {
		return h, false, "", p.internal(app, "reading the app's lease", err)
	}
	who := ""
	if held {
		who = p.describeHolder(app, h)
		if v, ok := parseLeaseNote(h.Note); ok {
			if err := p.Store.RequestCancel(app, CancelRequest{Release: v, User: user, At: time.Now().UTC(), Via: "apps:unlock"}); err != nil {
				return h, held, who, p.internal(app, "recording the cancel request", err)
			}
		}
	}
	if err := p.leases().Break(ctx, app); err != nil {
		return h, held, who, p.internal(app, "breaking the app's lease", err)
	}
	if q, err := p.Store.Queued(app); err == nil && q != nil && !p.Store.OwnerAlive(q.Owner) {
		p.Store.Dequeue(app, q.Release)
	}
	p.logger().Warn("app unlocked", "app", app, "by", user, "holder", h.Holder, "note", h.Note, "was_held", held)
	return h, held, who, nil
}
