package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// Names kpush gives the Lease objects of NewKube.
const (
	LeasePrefix    = "kpush-app-"                   // Lease name: LeasePrefix + app
	LabelManagedBy = "app.kubernetes.io/managed-by" // on every Lease; value ManagedBy
	ManagedBy      = "kpush"
	LabelApp       = "kpush.dev/app"        // the app the Lease is for
	AnnotationNote = "kpush.dev/lease-note" // Info.Note
	fieldManager   = "kpush"
)

// NewKube returns a Manager whose leases are coordination.k8s.io/v1 Leases named
// "kpush-app-<app>" in namespace (labels app.kubernetes.io/managed-by=kpush,
// kpush.dev/app=<app>; the note in annotation kpush.dev/lease-note), so that several kpush
// replicas share them. spec.holderIdentity, leaseDurationSeconds, acquireTime, renewTime and
// leaseTransitions mean what they mean for client-go's leader election (resourcelock.LeaseLock);
// a released lease has no holderIdentity. Every write is a JSON merge patch carrying the
// resourceVersion it read, so the API server refuses (409) a write based on a stale read;
// Break deletes the Lease. The TTL is rounded up to whole seconds. Needs get, list, watch,
// create, patch and delete on leases.coordination.k8s.io in namespace.
func NewKube(c coordinationv1client.LeasesGetter, namespace string, opts ...Option) *Manager {
	return newManager(&kubeStore{c: c, ns: namespace}, opts, func(ttl time.Duration) time.Duration {
		return time.Duration(max(math.Ceil(ttl.Seconds()), 1)) * time.Second
	})
}

type kubeStore struct {
	c  coordinationv1client.LeasesGetter
	ns string
}

func leaseName(app string) string { return LeasePrefix + app }

func (s *kubeStore) where(app string) string {
	return fmt.Sprintf("Lease %s in namespace %s", leaseName(app), s.ns)
}

func infoFromLease(app string, l *coordinationv1.Lease) Info {
	i := Info{App: app, Note: l.Annotations[AnnotationNote]}
	sp := l.Spec
	if sp.HolderIdentity != nil {
		i.Holder = *sp.HolderIdentity
	}
	if sp.LeaseDurationSeconds != nil {
		i.TTL = time.Duration(*sp.LeaseDurationSeconds) * time.Second
	}
	if sp.AcquireTime != nil {
		i.Acquired = sp.AcquireTime.Time
	}
	if sp.RenewTime != nil {
		i.Renewed = sp.RenewTime.Time
	}
	if sp.LeaseTransitions != nil {
		i.Transitions = int(*sp.LeaseTransitions)
	}
	return i
}

func leaseSpec(i Info) coordinationv1.LeaseSpec {
	secs, trans := int32(i.TTL/time.Second), int32(i.Transitions)
	sp := coordinationv1.LeaseSpec{
		LeaseDurationSeconds: &secs,
		AcquireTime:          &metav1.MicroTime{Time: i.Acquired},
		RenewTime:            &metav1.MicroTime{Time: i.Renewed},
		LeaseTransitions:     &trans,
	}
	if i.Holder != "" {
		sp.HolderIdentity = &i.Holder
	}
	return sp
}

func (s *kubeStore) get(ctx context.Context, app string) (Info, string, error) {
	l, err := s.c.Leases(s.ns).Get(ctx, leaseName(app), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Info{}, "", errNotFound
	}
	if err != nil {
		return Info{}, "", err
	}
	return infoFromLease(app, l), l.ResourceVersion, nil
}

func (s *kubeStore) create(ctx context.Context, app string, i Info) (string, error) {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: leaseName(app), Namespace: s.ns,
			Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelApp: app},
			Annotations: map[string]string{AnnotationNote: i.Note},
		},
		Spec: leaseSpec(i),
	}
	l, err := s.c.Leases(s.ns).Create(ctx, l, metav1.CreateOptions{FieldManager: fieldManager})
	if apierrors.IsAlreadyExists(err) {
		return "", errStale
	}
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}

// update patches spec and the note only (other labels and annotations stay), with
// metadata.resourceVersion as the precondition.
func (s *kubeStore) update(ctx context.Context, app string, i Info, version string) (string, error) {
	sp := leaseSpec(i)
	var holder any = nil // JSON null deletes the field in a merge patch
	if sp.HolderIdentity != nil {
		holder = *sp.HolderIdentity
	}
	patch := map[string]any{
		"metadata": map[string]any{
			"resourceVersion": version,
			"labels":          map[string]any{LabelManagedBy: ManagedBy, LabelApp: app},
			"annotations":     map[string]any{AnnotationNote: i.Note},
		},
		"spec": map[string]any{
			"holderIdentity":       holder,
			"leaseDurationSeconds": sp.LeaseDurationSeconds,
			"acquireTime":          sp.AcquireTime,
			"renewTime":            sp.RenewTime,
			"leaseTransitions":     sp.LeaseTransitions,
		},
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return "", err
	}
	l, err := s.c.Leases(s.ns).Patch(ctx, leaseName(app), types.MergePatchType, b, metav1.PatchOptions{FieldManager: fieldManager})
	switch {
	case apierrors.IsConflict(err):
		return "", errStale
	case apierrors.IsNotFound(err):
		return "", errNotFound
	case err != nil:
		return "", err
	}
	return l.ResourceVersion, nil
}

func (s *kubeStore) remove(ctx context.Context, app string) error {
	err := s.c.Leases(s.ns).Delete(ctx, leaseName(app), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// changed watches the Lease from version on and closes the channel at its first event (or
// when the watch ends).
func (s *kubeStore) changed(ctx context.Context, app, version string) (<-chan struct{}, func()) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := s.c.Leases(s.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", leaseName(app)).String(),
		ResourceVersion: version,
	})
	if err != nil {
		cancel()
		return nil, nil
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		select {
		case <-w.ResultChan():
		case <-ctx.Done():
		}
	}()
	return ch, func() { cancel(); w.Stop() }
}
