package knativetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"
)

// Outcome is what a StandIn reports for a Service's current generation.
type Outcome struct {
	// Status of the Ready condition: True, False or Unknown. ConfigurationsReady and
	// RoutesReady get the same status, reason and message.
	Status          corev1.ConditionStatus
	Reason, Message string
}

// Ready is the default Outcome: Ready=True.
var Ready = Outcome{Status: corev1.ConditionTrue}

// StandIn stands in for the Knative Serving controller, which is not running in envtest: it
// watches the serving.knative.dev/v1 Services in one namespace and writes their status the way
// the controller would once a revision is ready — status.observedGeneration = generation,
// conditions Ready, ConfigurationsReady and RoutesReady, URL http://<name>.<namespace>.example.com,
// latestCreatedRevisionName and latestReadyRevisionName "<name>-<generation, 5 digits>" and
// 100% traffic to that revision. It does not create Configurations, Revisions, Routes or pods.
//
// Set makes it report another Outcome (Ready=False or Unknown with a reason) for one Service,
// for failure and timeout tests.
type StandIn struct {
	cs servingclientset.Interface
	ns string
	t  testing.TB

	mu       sync.Mutex
	outcomes map[string]Outcome // by Service name; absent = Ready
	poke     chan struct{}
	done     chan struct{}
}

// StartStandIn starts a StandIn for namespace ns. It stops when ctx is done or on t.Cleanup,
// whichever is first; Cleanup waits for it to exit.
func StartStandIn(ctx context.Context, t testing.TB, cs servingclientset.Interface, ns string) *StandIn {
	ctx, cancel := context.WithCancel(ctx)
	s := &StandIn{
		cs: cs, ns: ns, t: t,
		outcomes: map[string]Outcome{},
		poke:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	go s.run(ctx)
	t.Cleanup(func() { cancel(); <-s.done })
	return s
}

// Set makes the StandIn report o for the Service name from now on, for its current and later
// generations, e.g. Set("demo", Outcome{Status: "False", Reason: "RevisionFailed", Message: "…"}).
func (s *StandIn) Set(name string, o Outcome) {
	s.mu.Lock()
	s.outcomes[name] = o
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

func (s *StandIn) outcome(name string) Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.outcomes[name]; ok {
		return o
	}
	return Ready
}

func (s *StandIn) run(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		rv := s.resyncAll(ctx)
		w, err := s.cs.ServingV1().Services(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			s.logf(ctx, "watching Services: %v", err)
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		s.drain(ctx, w)
		w.Stop()
	}
}

// drain handles watch events until the watch ends, ctx is done or Set pokes for a resync.
func (s *StandIn) drain(ctx context.Context, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.poke:
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			if svc, isSvc := ev.Object.(*servingv1.Service); isSvc && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				s.reconcile(ctx, svc)
			}
		}
	}
}

func (s *StandIn) resyncAll(ctx context.Context) string {
	list, err := s.cs.ServingV1().Services(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.logf(ctx, "listing Services: %v", err)
		return ""
	}
	for i := range list.Items {
		s.reconcile(ctx, &list.Items[i])
	}
	return list.ResourceVersion
}

func (s *StandIn) reconcile(ctx context.Context, svc *servingv1.Service) {
	want := desiredStatus(svc, s.outcome(svc.Name))
	if statusEqual(svc.Status, want) {
		return
	}
	svc = svc.DeepCopy()
	svc.Status = want
	_, err := s.cs.ServingV1().Services(s.ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	switch {
	case err == nil:
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		// A newer version is on its way through the watch; reconcile that one.
	default:
		s.logf(ctx, "updating status of Service %s: %v", svc.Name, err)
	}
}

func desiredStatus(svc *servingv1.Service, o Outcome) servingv1.ServiceStatus {
	st := svc.Status.DeepCopy()
	st.ObservedGeneration = svc.Generation
	rev := fmt.Sprintf("%s-%05d", svc.Name, svc.Generation)
	st.LatestCreatedRevisionName = rev
	now := apis.VolatileTime{Inner: metav1.Now()}
	cond := func(t apis.ConditionType) apis.Condition {
		c := apis.Condition{Type: t, Status: o.Status, Reason: o.Reason, Message: o.Message, LastTransitionTime: now}
		if old := svc.Status.GetCondition(t); old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			c.LastTransitionTime = old.LastTransitionTime
		}
		return c
	}
	st.Conditions = duckv1.Conditions{
		cond(servingv1.ServiceConditionConfigurationsReady),
		cond(apis.ConditionReady),
		cond(servingv1.ServiceConditionRoutesReady),
	}
	if o.Status == corev1.ConditionTrue {
		st.LatestReadyRevisionName = rev
		st.URL = &apis.URL{Scheme: "http", Host: fmt.Sprintf("%s.%s.example.com", svc.Name, svc.Namespace)}
		latest := true
		pct := int64(100)
		st.Traffic = []servingv1.TrafficTarget{{RevisionName: rev, LatestRevision: &latest, Percent: &pct}}
	}
	return *st
}

func statusEqual(a, b servingv1.ServiceStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration ||
		a.LatestCreatedRevisionName != b.LatestCreatedRevisionName ||
		a.LatestReadyRevisionName != b.LatestReadyRevisionName ||
		a.URL.String() != b.URL.String() || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range b.Conditions {
		o := a.GetCondition(c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message {
			return false
		}
	}
	return true
}

func (s *StandIn) logf(ctx context.Context, format string, args ...any) {
	if ctx.Err() == nil { // errors after stop are only the cancellation itself
		s.t.Logf("knativetest: stand-in controller: "+format, args...)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
