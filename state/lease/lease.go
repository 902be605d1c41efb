// Package lease gives one holder at a time a per-app lease, so that concurrent pushes and
// config changes of one app never run their deploys on top of each other, across goroutines,
// processes and kpush replicas.
//
// A lease has a holder, a TTL and a renew time, like a coordination.k8s.io/v1 Lease
// (https://kubernetes.io/docs/concepts/architecture/leases/) and client-go's leader election
// (k8s.io/client-go/tools/leaderelection): the holder renews it every TTL/3 in the
// background; a holder that stops renewing (crashed, killed, partitioned) loses it once the
// TTL has passed since its last renewal, and the next Acquire takes it. A lease left behind
// by a dead process therefore blocks others for at most one TTL, never forever; Break
// (apps:unlock) frees it at once.
//
// Three stores share those semantics: NewKube (a Lease object per app in kpush's namespace,
// for several replicas), NewLocal (in this process, for `kpush dev`) and NewFile (a directory,
// for several dev processes sharing a data directory).
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults for the Options.
const (
	DefaultTTL = 30 * time.Second
	// The default renew interval is TTL/3 (client-go's leader election renews at about 2/3
	// of the lease duration at the latest; TTL/3 leaves two renewals of slack).
	defaultRenewDivisor = 3
)

// Polling bounds for Acquire while the lease is held by someone else. It also wakes when
// the store reports a change (Kube: a watch on the Lease; Local: in-process notification).
const (
	minPoll = 50 * time.Millisecond
	maxPoll = 2 * time.Second
)

// Errors (wrapped; test with errors.Is).
var (
	// ErrInvalidApp: the app name is not a DNS-1035 label.
	ErrInvalidApp = errors.New("invalid app name")
	// ErrLost: the lease was taken by another holder or broken (apps:unlock) before Release.
	ErrLost = errors.New("lease lost")
)

// Info is a lease as stored.
type Info struct {
	App string `json:"app"`
	// Holder is the holder's identity (Identity + "#<n>"), "" when released or never held.
	Holder string `json:"holder,omitempty"`
	// Note says what the holder is doing, for people, e.g. "build #12 by alice, abc1234".
	Note string `json:"note,omitempty"`
	// Acquired is when Holder took the lease; Renewed when it last renewed it (by the
	// writer's clock).
	Acquired time.Time `json:"acquired"`
	Renewed  time.Time `json:"renewed"`
	// TTL is how long after Renewed the lease stays Holder's without a renewal.
	TTL time.Duration `json:"ttl"`
	// Transitions counts how often the lease changed hands.
	Transitions int `json:"transitions"`
}

// Expired reports whether the lease is free at now: it has no holder, or its holder has not
// renewed it for TTL (now ≥ Renewed+TTL). A TTL ≤ 0 counts as expired.
func (i Info) Expired(now time.Time) bool {
	return i.Holder == "" || i.TTL <= 0 || !now.Before(i.Renewed.Add(i.TTL))
}

// ExpiresAt is when the lease becomes free unless renewed (zero when it has no holder).
func (i Info) ExpiresAt() time.Time {
	if i.Holder == "" {
		return time.Time{}
	}
	return i.Renewed.Add(i.TTL)
}

// Locker hands out per-app leases. The receiver holds an app's lease for the whole of one
// push or config change. Implemented by *Manager.
type Locker interface {
	// Acquire blocks until this process holds app's lease or ctx ends (then ctx's error,
	// wrapped). note says what for ("build #12 by alice, abc1234") and is shown to whoever
	// waits. waiting, if not nil, is called each time Acquire finds a different holder in its
	// way (for "queued behind …" messages); it must not block. The lease is renewed in the
	// background until Release; Lease.Lost tells when renewal failed.
	Acquire(ctx context.Context, app, note string, waiting func(holder Info)) (*Lease, error)
	// Holder reports app's lease and whether someone holds it now (not released, not
	// expired). A never-used app gives Info{App: app}, false, nil.
	Holder(ctx context.Context, app string) (Info, bool, error)
	// Break frees app's lease whoever holds it (apps:unlock). The holder learns on its next
	// renewal (Lost). Breaking a free lease is not an error.
	Break(ctx context.Context, app string) error
}

// store is where a Manager keeps leases. Versions are opaque; a write with a stale version
// fails with errStale, so every change is a compare-and-swap.
type store interface {
	// get returns app's lease and its version, or errNotFound.
	get(ctx context.Context, app string) (Info, string, error)
	// create stores a new lease for app, or fails with errStale when one exists.
	create(ctx context.Context, app string, i Info) (string, error)
	// update replaces app's lease if its version is still version; errStale if not,
	// errNotFound if it is gone.
	update(ctx context.Context, app string, i Info, version string) (string, error)
	// remove deletes app's lease unconditionally; a missing lease is not an error.
	remove(ctx context.Context, app string) error
	// changed returns a channel that is closed when app's lease may have changed after
	// version, and a stop func; a nil channel means the store cannot tell (poll only).
	changed(ctx context.Context, app, version string) (<-chan struct{}, func())
	// where names the store for messages, e.g. "Lease kpush-app-demo in namespace kpush".
	where(app string) string
}

var (
	errNotFound = errors.New("lease not found")
	errStale    = errors.New("lease changed since read")
)

// Option configures a Manager.
type Option func(*Manager)

// WithTTL sets how long a lease outlives its holder's last renewal (default 30 s). NewKube
// rounds it up to whole seconds (Lease.spec.leaseDurationSeconds).
func WithTTL(d time.Duration) Option { return func(m *Manager) { m.ttl = d } }

// WithRenewEvery sets how often a held lease is renewed (default TTL/3). It must be below
// the TTL; otherwise TTL/3 is used.
func WithRenewEvery(d time.Duration) Option { return func(m *Manager) { m.renew = d } }

// WithIdentity sets this process's holder identity (default ProcessIdentity()). Each
// Acquire appends "#<n>", so two acquisitions in one process are different holders.
func WithIdentity(id string) Option { return func(m *Manager) { m.id = id } }

// WithLogger sets the logger for internal detail (default: discard).
func WithLogger(l *slog.Logger) Option { return func(m *Manager) { m.log = l } }

// ProcessIdentity returns "<hostname>_<pid>_<8 hex random>": in a pod the hostname is the
// pod's name; the random part makes a restarted process (same pod, maybe same pid) a new
// holder that must wait out its predecessor's TTL rather than inherit its leases.
func ProcessIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "_" + strconv.Itoa(os.Getpid()) + "_" + hex.EncodeToString(b[:])
}

// Manager implements Locker on a store. Build it with NewKube, NewLocal or NewFile; it is
// safe for concurrent use.
type Manager struct {
	st    store
	ttl   time.Duration
	renew time.Duration
	id    string
	seq   atomic.Int64
	log   *slog.Logger
}

var _ Locker = (*Manager)(nil)

// newManager applies opts; roundTTL, if not nil, adjusts the TTL to what the store can keep.
func newManager(st store, opts []Option, roundTTL func(time.Duration) time.Duration) *Manager {
	m := &Manager{st: st, ttl: DefaultTTL, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(m)
	}
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if roundTTL != nil {
		m.ttl = roundTTL(m.ttl)
	}
	if m.renew <= 0 || m.renew >= m.ttl {
		m.renew = m.ttl / defaultRenewDivisor
	}
	if m.id == "" {
		m.id = ProcessIdentity()
	}
	identities.Store(m.id, true)
	return m
}

// Identity is this Manager's holder identity prefix (see WithIdentity).
func (m *Manager) Identity() string { return m.id }

// TTL is the lease duration this Manager writes.
func (m *Manager) TTL() time.Duration { return m.ttl }

func checkApp(app string) error {
	if errs := validation.IsDNS1035Label(app); len(errs) > 0 {
		return fmt.Errorf("%w %q: %s", ErrInvalidApp, app, errs[0])
	}
	return nil
}

// Acquire implements Locker. See the package doc for when a held lease counts as free.
// Besides Info.Expired (by this machine's clock), a lease whose stored version has not
// changed for a full TTL while Acquire watched it counts as expired too: a live holder
// changes it every renew interval, so this frees a dead holder's lease even when the clocks
// of the two machines disagree.
func (m *Manager) Acquire(ctx context.Context, app, note string, waiting func(Info)) (*Lease, error) {
	if err := checkApp(app); err != nil {
		return nil, err
	}
	id := m.id + "#" + strconv.FormatInt(m.seq.Add(1), 10)
	log := m.log.With("app", app, "holder", id)
	var (
		seenVersion string
		seenSince   time.Time // monotonic
		lastHolder  string
		poll        = minPoll
	)
	for {
		cur, version, err := m.st.get(ctx, app)
		now := time.Now()
		var next Info
		switch {
		case errors.Is(err, errNotFound):
			next = Info{App: app, Holder: id, Note: note, Acquired: now, Renewed: now, TTL: m.ttl, Transitions: 0}
			version, err = m.st.create(ctx, app, next)
		case err != nil:
			return nil, fmt.Errorf("reading %s: %w", m.st.where(app), err)
		default:
			if version != seenVersion {
				seenVersion, seenSince = version, now
			}
			stuck := cur.Holder != "" && now.Sub(seenSince) >= cur.TTL
			dead := m.holderDead(cur)
			if !cur.Expired(now) && !stuck && !dead {
				if cur.Holder != lastHolder {
					lastHolder, poll = cur.Holder, minPoll
					log.Debug("lease held, waiting", "by", cur.Holder, "note", cur.Note, "expires_at", cur.ExpiresAt())
					if waiting != nil {
						waiting(cur)
					}
				}
				wait := min(poll, time.Until(cur.ExpiresAt())+10*time.Millisecond, cur.TTL-now.Sub(seenSince)+10*time.Millisecond)
				wait = max(wait, 10*time.Millisecond)
				poll = min(2*poll, maxPoll, m.renew)
				if err := m.sleep(ctx, app, version, wait); err != nil {
					return nil, fmt.Errorf("waiting for the lease of app %s (held by %s: %s): %w", app, cur.Holder, cur.Note, err)
				}
				continue
			}
			switch {
			case dead && !cur.Expired(now):
				log.Info("taking over the lease of a dead process on this host", "from", cur.Holder, "note", cur.Note)
			case cur.Holder != "":
				log.Info("taking over expired lease", "from", cur.Holder, "note", cur.Note, "renewed", cur.Renewed, "ttl", cur.TTL)
			}
			next = Info{App: app, Holder: id, Note: note, Acquired: now, Renewed: now, TTL: m.ttl, Transitions: cur.Transitions + 1}
			version, err = m.st.update(ctx, app, next, version)
		}
		switch {
		case err == nil:
			log.Info("lease acquired", "note", note, "ttl", m.ttl)
			return m.hold(app, next, version), nil
		case errors.Is(err, errStale), errors.Is(err, errNotFound):
			continue // someone else wrote in between: look again
		default:
			return nil, fmt.Errorf("writing %s: %w", m.st.where(app), err)
		}
	}
}

// sleep waits for d, a change notification from the store, or ctx.
func (m *Manager) sleep(ctx context.Context, app, version string, d time.Duration) error {
	ch, stop := m.st.changed(ctx, app, version)
	if stop != nil {
		defer stop()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-ch:
	}
	return nil
}

// Holder implements Locker.
func (m *Manager) Holder(ctx context.Context, app string) (Info, bool, error) {
	if err := checkApp(app); err != nil {
		return Info{}, false, err
	}
	cur, _, err := m.st.get(ctx, app)
	if errors.Is(err, errNotFound) {
		return Info{App: app}, false, nil
	}
	if err != nil {
		return Info{}, false, fmt.Errorf("reading %s: %w", m.st.where(app), err)
	}
	return cur, !cur.Expired(time.Now()) && !m.holderDead(cur), nil
}

// deadHolders is implemented by stores whose holders all run on one machine (fileStore, from
// NewFile; the Kubernetes Lease store cannot tell): a lease whose holder process is known to
// be gone is free at once, without waiting out its TTL. Manager finds it by type assertion.
type deadHolders interface {
	holderDead(holder string) bool
}

var _ deadHolders = (*fileStore)(nil)

// holderDead reports whether the store knows i's holder process to be gone.
func (m *Manager) holderDead(i Info) bool {
	d, ok := m.st.(deadHolders)
	return ok && i.Holder != "" && d.holderDead(i.Holder)
}

// identities holds the identity of every Manager of this process (newManager).
var identities sync.Map

// ProcessGone reports whether holder, a holder identity ("<hostname>_<pid>_<random>#<n>",
// ProcessIdentity plus Acquire's suffix), names a process of this host that no longer runs:
// its pid does not exist (kill(pid, 0) fails with ESRCH), or it is this process's pid under
// an identity no Manager of this process has (a restarted process that got the same pid, as
// pid 1 of a restarted container). A holder of another host, or an identity of another form,
// is not known to be gone.
func ProcessGone(holder string) bool {
	id, _, _ := strings.Cut(holder, "#")
	i := strings.LastIndexByte(id, '_')
	if i < 0 {
		return false
	}
	j := strings.LastIndexByte(id[:i], '_')
	if j < 0 {
		return false
	}
	host, pidText := id[:j], id[j+1:i]
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	if me, err := os.Hostname(); err != nil || me != host {
		return false
	}
	if pid == os.Getpid() {
		_, mine := identities.Load(id)
		return !mine
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// Break implements Locker: it deletes app's lease record.
func (m *Manager) Break(ctx context.Context, app string) error {
	if err := checkApp(app); err != nil {
		return err
	}
	if err := m.st.remove(ctx, app); err != nil {
		return fmt.Errorf("deleting %s: %w", m.st.where(app), err)
	}
	m.log.Warn("lease broken", "app", app)
	return nil
}

// Lease is one held lease. Release it when done; it is safe for concurrent use.
type Lease struct {
	m    *Manager
	app  string
	lost chan struct{}
	stop context.CancelFunc
	done chan struct{} // closed when the renew loop has ended

	mu      sync.Mutex
	info    Info
	version string
	lostErr error
}

func (m *Manager) hold(app string, i Info, version string) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lease{m: m, app: app, info: i, version: version, lost: make(chan struct{}), stop: cancel, done: make(chan struct{})}
	go l.renewLoop(ctx)
	return l
}

// Info returns the lease as last written by this holder.
func (l *Lease) Info() Info {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info
}

// Lost is closed when this holder no longer holds the lease: another holder took it, it was
// broken (apps:unlock), or renewal kept failing until the TTL ran out. Err says which. It is
// not closed by Release.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lease is held, and an error wrapping ErrLost once Lost is closed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

func (l *Lease) renewLoop(ctx context.Context) {
	defer close(l.done)
	log := l.m.log.With("app", l.app, "holder", l.info.Holder)
	every := l.m.renew
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := l.renewOnce(ctx)
		switch {
		case err == nil:
			t.Reset(every)
		case errors.Is(err, ErrLost):
			l.markLost(err)
			log.Warn("lease lost", "err", err)
			return
		case ctx.Err() != nil:
			return
		default:
			// Transient (API server unreachable …): keep trying until the TTL since the last
			// successful renewal has passed; from then on another holder may take it.
			if time.Since(l.Info().Renewed) >= l.m.ttl {
				err = fmt.Errorf("%w: app %s: could not renew %s for %s: %w", ErrLost, l.app, l.m.st.where(l.app), l.m.ttl, err)
				l.markLost(err)
				log.Warn("lease lost", "err", err)
				return
			}
			log.Warn("renewing lease failed, retrying", "err", err)
			t.Reset(max(every/4, 10*time.Millisecond))
		}
	}
}

// renewOnce writes a new renew time, guarded by the version this holder last wrote.
func (l *Lease) renewOnce(ctx context.Context) error {
	l.mu.Lock()
	next, version := l.info, l.version
	l.mu.Unlock()
	next.Renewed = time.Now()
	for range 3 {
		v, err := l.m.st.update(ctx, l.app, next, version)
		if err == nil {
			l.mu.Lock()
			l.info, l.version = next, v
			l.mu.Unlock()
			return nil
		}
		if !errors.Is(err, errStale) && !errors.Is(err, errNotFound) {
			return err
		}
		cur, v, gerr := l.m.st.get(ctx, l.app)
		switch {
		case errors.Is(gerr, errNotFound):
			return fmt.Errorf("%w: the lease of app %s was broken (apps:unlock)", ErrLost, l.app)
		case gerr != nil:
			return gerr
		case cur.Holder != next.Holder:
			if cur.Holder == "" {
				return fmt.Errorf("%w: the lease of app %s was released by someone else", ErrLost, l.app)
			}
			return fmt.Errorf("%w: the lease of app %s was taken by %s (%s)", ErrLost, l.app, cur.Holder, cur.Note)
		}
		version = v // still ours; someone touched other fields (labels …): write again
	}
	return fmt.Errorf("renewing %s: it keeps changing under this holder", l.m.st.where(l.app))
}

func (l *Lease) markLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		l.lostErr = err
		close(l.lost)
	}
}

// Release stops renewing and frees the lease for the next Acquire (it clears the holder,
// guarded by the version this holder last wrote, so a lease that was meanwhile lost is left
// to its new holder). Releasing twice, or after Lost, is not an error.
func (l *Lease) Release(ctx context.Context) error {
	l.stop()
	<-l.done
	if l.Err() != nil {
		return nil
	}
	l.mu.Lock()
	next, version := l.info, l.version
	l.mu.Unlock()
	if next.Holder == "" {
		return nil
	}
	holder := next.Holder
	next.Holder, next.Note, next.Renewed = "", "", time.Now()
	for range 3 {
		v, err := l.m.st.update(ctx, l.app, next, version)
		if err == nil || errors.Is(err, errNotFound) {
			l.mu.Lock()
			l.info, l.version = next, v
			l.mu.Unlock()
			l.m.log.Info("lease released", "app", l.app, "holder", holder)
			return nil
		}
		if !errors.Is(err, errStale) {
			return fmt.Errorf("releasing %s: %w", l.m.st.where(l.app), err)
		}
		cur, v, gerr := l.m.st.get(ctx, l.app)
		if errors.Is(gerr, errNotFound) || (gerr == nil && cur.Holder != holder) {
			return nil // broken or taken over meanwhile: nothing of ours to free
		}
		if gerr != nil {
			return fmt.Errorf("releasing %s: %w", l.m.st.where(l.app), gerr)
		}
		version = v
	}
	return fmt.Errorf("releasing %s: it keeps changing under this holder", l.m.st.where(l.app))
}

// abandon stops renewing without releasing, as a crash would (tests).
func (l *Lease) abandon() {
	l.stop()
	<-l.done
}
