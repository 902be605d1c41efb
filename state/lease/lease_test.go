package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kpush.dev/kpush/deployer/knativetest"
)

// cfg reaches one real kube-apiserver shared by this package's Kube tests (coordination.k8s.io
// is built in); each test works in its own namespace.
var cfg *rest.Config

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	os.Exit(knativetest.Main(m, &cfg))
}

// kind is one store under test; newLocker returns Managers that share one store (for
// Local: one in-process table, so "two holders" are two Managers' Acquires in one process).
type kind struct {
	name string
	ttl  time.Duration
	new  func(t *testing.T) func(opts ...Option) *Manager
}

func kinds() []kind {
	return []kind{{
		name: "Local", ttl: 300 * time.Millisecond,
		new: func(t *testing.T) func(...Option) *Manager {
			shared := NewLocal()
			return func(opts ...Option) *Manager {
				m := NewLocal(opts...)
				m.st = shared.st
				return m
			}
		},
	}, {
		name: "File", ttl: 300 * time.Millisecond,
		new: func(t *testing.T) func(...Option) *Manager {
			dir := t.TempDir()
			return func(opts ...Option) *Manager {
				m, err := NewFile(dir, opts...)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
		},
	}, {
		name: "Kube", ttl: 2 * time.Second,
		new: func(t *testing.T) func(...Option) *Manager {
			ns := knativetest.Namespace(t, cfg)
			cs := kubernetes.NewForConfigOrDie(cfg)
			return func(opts ...Option) *Manager { return NewKube(cs.CoordinationV1(), ns, opts...) }
		},
	}}
}

func forEachKind(t *testing.T, f func(t *testing.T, k kind, newLocker func(...Option) *Manager)) {
	for _, k := range kinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f(t, k, k.new(t))
		})
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func acquire(ctx context.Context, t *testing.T, m *Manager, app, note string) *Lease {
	t.Helper()
	l, err := m.Acquire(ctx, app, note, nil)
	if err != nil {
		t.Fatalf("Acquire(%s, %q): %v", app, note, err)
	}
	return l
}

// TestContendAndHandOver: while A holds (and renews for several TTLs), B waits, is told who
// is in its way, and gets the lease only after A releases; Holder reports each in turn.
func TestContendAndHandOver(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind, newLocker func(...Option) *Manager) {
		ctx := testCtx(t)
		ma, mb := newLocker(WithTTL(k.ttl), WithIdentity("a")), newLocker(WithTTL(k.ttl), WithIdentity("b"))
		la := acquire(ctx, t, ma, "demo", "build #1 by alice")
		if info, held, err := mb.Holder(ctx, "demo"); err != nil || !held || info.Holder != "a#1" || info.Note != "build #1 by alice" {
			t.Fatalf("Holder = %+v, %v, %v; want held by a#1 with note", info, held, err)
		}

		var (
			mu     sync.Mutex
			seen   []string
			bDone  = make(chan *Lease, 1)
			bErr   = make(chan error, 1)
			before = time.Now()
		)
		go func() {
			l, err := mb.Acquire(ctx, "demo", "build #2 by bob", func(h Info) {
				mu.Lock()
				seen = append(seen, h.Holder+": "+h.Note)
				mu.Unlock()
			})
			if err != nil {
				bErr <- err
				return
			}
			bDone <- l
		}()
		// A keeps renewing: B must still be waiting after 3 TTLs.
		select {
		case l := <-bDone:
			t.Fatalf("B acquired at %v while A held and renewed the lease (A: %+v)", l.Info().Acquired, la.Info())
		case err := <-bErr:
			t.Fatalf("B: %v", err)
		case <-time.After(3 * k.ttl):
		}
		if !la.Info().Renewed.After(before) {
			t.Errorf("A did not renew while holding: %+v", la.Info())
		}
		select {
		case <-la.Lost():
			t.Fatalf("A lost a lease it renews: %v", la.Err())
		default:
		}
		released := time.Now()
		if err := la.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		var lb *Lease
		select {
		case lb = <-bDone:
		case err := <-bErr:
			t.Fatalf("B: %v", err)
		case <-ctx.Done():
			t.Fatal("B never acquired after A released")
		}
		defer lb.Release(ctx)
		info := lb.Info()
		if info.Holder != "b#1" || info.Acquired.Before(released) || info.Transitions != 1 {
			t.Errorf("B's lease %+v: want holder b#1, acquired after the release at %v, 1 transition", info, released)
		}
		mu.Lock()
		if len(seen) != 1 || seen[0] != "a#1: build #1 by alice" {
			t.Errorf("waiting callback saw %q, want [a#1: build #1 by alice]", seen)
		}
		mu.Unlock()
		if got, held, err := ma.Holder(ctx, "demo"); err != nil || !held || got.Holder != "b#1" {
			t.Errorf("Holder after hand-over = %+v, %v, %v; want b#1", got, held, err)
		}
		if err := la.Release(ctx); err != nil {
			t.Errorf("second Release: %v", err)
		}
		if got, _, _ := ma.Holder(ctx, "demo"); got.Holder != "b#1" {
			t.Errorf("A's second Release freed B's lease: holder %q", got.Holder)
		}
	})
}

// TestOnlyOneHolder: many Acquires race; every critical section runs alone.
func TestOnlyOneHolder(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind, newLocker func(...Option) *Manager) {
		ctx := testCtx(t)
		var (
			inside, maxInside int
			mu                sync.Mutex
			wg                sync.WaitGroup
		)
		for i := range 4 {
			m := newLocker(WithTTL(k.ttl), WithIdentity(fmt.Sprint("p", i)))
			wg.Go(func() {
				for range 3 {
					l, err := m.Acquire(ctx, "demo", "", nil)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					maxInside = max(maxInside, inside)
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					mu.Lock()
					inside--
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if maxInside != 1 {
			t.Errorf("%d holders at once, want 1", maxInside)
		}
	})
}

// TestCrashedHolderExpires: A stops renewing without releasing (as a crash would). B takes
// over once A's last renewal is a TTL old, and not before.
func TestCrashedHolderExpires(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind, newLocker func(...Option) *Manager) {
		ctx := testCtx(t)
		ma, mb := newLocker(WithTTL(k.ttl), WithIdentity("a")), newLocker(WithTTL(k.ttl), WithIdentity("b"))
		la := acquire(ctx, t, ma, "demo", "crashes")
		la.abandon()
		stored, held, err := mb.Holder(ctx, "demo")
		if err != nil || !held || stored.Holder != "a#1" {
			t.Fatalf("Holder after crash = %+v, %v, %v; want still a#1 until the TTL passes", stored, held, err)
		}
		lb := acquire(ctx, t, mb, "demo", "after crash")
		defer lb.Release(ctx)
		got := lb.Info()
		if deadline := stored.Renewed.Add(stored.TTL); got.Acquired.Before(deadline) {
			t.Errorf("B acquired at %v, before A's lease expired at %v (renewed %v + ttl %v)", got.Acquired, deadline, stored.Renewed, stored.TTL)
		}
		if stored.TTL != k.ttl {
			t.Errorf("stored TTL %v, want %v", stored.TTL, k.ttl)
		}
		if limit := stored.Renewed.Add(stored.TTL + 2*time.Second); got.Acquired.After(limit) {
			t.Errorf("B acquired at %v, long after A's lease expired at %v", got.Acquired, stored.Renewed.Add(stored.TTL))
		}
		if got.Transitions != 1 {
			t.Errorf("transitions = %d, want 1", got.Transitions)
		}
	})
}

// TestBreakAndLost: Break frees a live holder's lease at once; when B then takes it, A's
// next renewal notices and Lost fires with an error naming the new holder. A's Release then
// leaves B's lease alone.
func TestBreakAndLost(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind, newLocker func(...Option) *Manager) {
		ctx := testCtx(t)
		ma, mb := newLocker(WithTTL(k.ttl), WithIdentity("a")), newLocker(WithTTL(k.ttl), WithIdentity("b"))
		la := acquire(ctx, t, ma, "demo", "stuck deploy")
		if err := mb.Break(ctx, "demo"); err != nil {
			t.Fatalf("Break: %v", err)
		}
		if info, held, err := mb.Holder(ctx, "demo"); err != nil || held {
			t.Fatalf("Holder after Break = %+v, %v, %v; want free", info, held, err)
		}
		lb := acquire(ctx, t, mb, "demo", "after unlock")
		if lb.Info().Acquired.After(la.Info().Renewed.Add(k.ttl)) {
			t.Errorf("B waited for A's TTL after Break (acquired %v, A renewed %v)", lb.Info().Acquired, la.Info().Renewed)
		}
		select {
		case <-la.Lost():
		case <-time.After(2 * k.ttl):
			t.Fatal("A's Lost did not fire within 2 TTLs after B took the lease")
		}
		if err := la.Err(); !errors.Is(err, ErrLost) {
			t.Errorf("A's Err = %v, want ErrLost", err)
		} else if want := "taken by b#1"; !strings.Contains(err.Error(), want) {
			t.Errorf("A's Err %q does not say %q", err, want)
		}
		if err := la.Release(ctx); err != nil {
			t.Errorf("Release after Lost: %v", err)
		}
		if info, held, _ := mb.Holder(ctx, "demo"); !held || info.Holder != "b#1" {
			t.Errorf("after A's Release, holder %+v held=%v; want b#1 kept", info, held)
		}
		select {
		case <-lb.Lost():
			t.Errorf("B lost its lease: %v", lb.Err())
		default:
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := mb.Break(ctx, "demo"); err != nil {
			t.Errorf("Break of a released lease: %v", err)
		}
		if err := mb.Break(ctx, "demo"); err != nil {
			t.Errorf("Break of a missing lease: %v", err)
		}
	})
}

func TestAcquireCancelled(t *testing.T) {
	forEachKind(t, func(t *testing.T, k kind, newLocker func(...Option) *Manager) {
		ctx := testCtx(t)
		m := newLocker(WithTTL(k.ttl))
		l := acquire(ctx, t, m, "demo", "holding")
		defer l.Release(ctx)
		short, cancel := context.WithTimeout(ctx, k.ttl/2)
		defer cancel()
		_, err := m.Acquire(short, "demo", "second", nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire with a short deadline = %v, want DeadlineExceeded", err)
		}
		if _, err := m.Acquire(ctx, "Bad_Name", "", nil); !errors.Is(err, ErrInvalidApp) {
			t.Errorf("Acquire(Bad_Name) = %v, want ErrInvalidApp", err)
		}
	})
}

// TestKubeLeaseObject checks the stored Lease: name, labels, spec fields.
func TestKubeLeaseObject(t *testing.T) {
	ctx := testCtx(t)
	ns := knativetest.Namespace(t, cfg)
	cs := kubernetes.NewForConfigOrDie(cfg)
	m := NewKube(cs.CoordinationV1(), ns, WithTTL(2*time.Second), WithIdentity("pod-1_42_abcd"))
	l := acquire(ctx, t, m, "demo", "build #3 by carol, 1234567")
	obj, err := cs.CoordinationV1().Leases(ns).Get(ctx, "kpush-app-demo", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the Lease: %v", err)
	}
	if obj.Labels[LabelManagedBy] != "kpush" || obj.Labels[LabelApp] != "demo" || obj.Annotations[AnnotationNote] != "build #3 by carol, 1234567" {
		t.Errorf("labels %v annotations %v", obj.Labels, obj.Annotations)
	}
	sp := obj.Spec
	if sp.HolderIdentity == nil || *sp.HolderIdentity != "pod-1_42_abcd#1" || sp.LeaseDurationSeconds == nil || *sp.LeaseDurationSeconds != 2 ||
		sp.AcquireTime == nil || sp.RenewTime == nil {
		t.Errorf("spec = %+v", sp)
	}
	// Someone else labels the Lease: renewal and release keep their label.
	for attempt := 0; ; attempt++ {
		obj.Labels["team"] = "payments"
		_, err := cs.CoordinationV1().Leases(ns).Update(ctx, obj, metav1.UpdateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || attempt > 5 {
			t.Fatal(err)
		}
		if obj, err = cs.CoordinationV1().Leases(ns).Get(ctx, "kpush-app-demo", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // at least one renewal after the label
	if got, _, _ := m.Holder(ctx, "demo"); got.Holder != "pod-1_42_abcd#1" {
		t.Errorf("holder after someone labelled the Lease: %+v", got)
	}
	select {
	case <-l.Lost():
		t.Errorf("lease lost because someone labelled it: %v", l.Err())
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	obj, err = cs.CoordinationV1().Leases(ns).Get(ctx, "kpush-app-demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if obj.Spec.HolderIdentity != nil || obj.Labels["team"] != "payments" {
		t.Errorf("after Release: holder %v, labels %v; want no holder, team label kept", obj.Spec.HolderIdentity, obj.Labels)
	}
}
