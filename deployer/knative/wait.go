package knative

import (
	"context"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

// readiness is what one look at a Service says about generation gen.
type readiness struct {
	url   string // set when Ready=True
	err   error  // set when Ready=False, or the Service is gone
	state string // for people: what is being waited for
	cond  bool   // state describes a Ready condition of generation >= gen (worth printing)
}

func (d *Deployer) assess(svc *servingv1.Service, gen int64) readiness {
	st := svc.Status
	if st.ObservedGeneration < gen {
		return readiness{state: fmt.Sprintf("the Knative controller has not yet observed generation %d (observed %d)", gen, st.ObservedGeneration)}
	}
	c := st.GetCondition(apis.ConditionReady)
	if c == nil {
		return readiness{state: fmt.Sprintf("generation %d has no Ready condition yet", st.ObservedGeneration)}
	}
	desc := describe(c)
	switch c.Status {
	case corev1.ConditionTrue:
		if st.URL == nil {
			return readiness{err: fmt.Errorf("%w: Knative Service %s/%s is Ready but has no URL in its status", ErrNotReady, d.ns, svc.Name)}
		}
		return readiness{url: st.URL.String(), state: desc, cond: true}
	case corev1.ConditionFalse:
		return readiness{err: fmt.Errorf("%w: Knative Service %s/%s generation %d: %s; inspect it with `kubectl describe ksvc %s -n %s`",
			ErrNotReady, d.ns, svc.Name, st.ObservedGeneration, desc, svc.Name, d.ns)}
	default:
		return readiness{state: desc, cond: true}
	}
}

func describe(c *apis.Condition) string {
	s := fmt.Sprintf("Ready=%s", c.Status)
	switch {
	case c.Reason != "" && c.Message != "":
		s += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
	case c.Reason != "" || c.Message != "":
		s += fmt.Sprintf(" (%s%s)", c.Reason, c.Message)
	}
	return s
}

// WaitReady waits until the Service name reports, for generation gen or later
// (status.observedGeneration >= gen), condition Ready=True, and returns its status.url. It
// watches the Service and also reads it every poll interval, so a watch that cannot start or
// breaks only slows it down. Changes of a not-yet-ready condition are printed to out.
//
// Errors (wrapped): ErrNotReady with the condition's reason and message when Ready=False;
// ErrReadyTimeout after the ready timeout, with the last state seen; ctx.Err() when ctx ends.
func (d *Deployer) WaitReady(ctx context.Context, name string, gen int64, out io.Writer) (string, error) {
	services := d.cs.ServingV1().Services(d.ns)
	log := d.log.With("app", name, "generation", gen)
	timeout := time.NewTimer(d.readyTimeout)
	defer timeout.Stop()
	poll := time.NewTicker(d.pollInterval)
	defer poll.Stop()

	var (
		w       watch.Interface
		rv      string // resourceVersion to watch from
		last    = "no status read yet"
		printed string
		rewatch = true // false after a watch ended, until the next poll: no hot loop
	)
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	// seen handles one version of the Service; done reports the end of the wait.
	seen := func(svc *servingv1.Service) (url string, done bool, err error) {
		rv = svc.ResourceVersion
		r := d.assess(svc, gen)
		if r.err != nil {
			return "", true, r.err
		}
		if r.url != "" {
			return r.url, true, nil
		}
		if r.state != last {
			log.Debug("waiting for ready", "state", r.state, "resource_version", rv)
			last = r.state
		}
		if r.cond && r.state != printed {
			fmt.Fprintf(out, "       %s\n", r.state)
			printed = r.state
		}
		return "", false, nil
	}
	read := func() (string, bool, error) {
		svc, err := services.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("reading service while waiting for ready", "err", err)
			}
			return "", false, nil // the next poll or event tries again; the timeout bounds it
		}
		return seen(svc)
	}

	if url, done, err := read(); done {
		return url, err
	}
	for {
		if w == nil && rewatch {
			var err error
			w, err = services.Watch(ctx, metav1.ListOptions{
				FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
				ResourceVersion: rv,
			})
			if err != nil {
				log.Warn("watching service failed, polling instead", "err", err)
				w, rewatch = nil, false
			}
		}
		var events <-chan watch.Event
		if w != nil {
			events = w.ResultChan()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for Knative Service %s/%s to become Ready: %w", d.ns, name, ctx.Err())
		case <-timeout.C:
			return "", fmt.Errorf("%w: Knative Service %s/%s generation %d timed out after %s waiting for Ready; last seen: %s",
				ErrReadyTimeout, d.ns, name, gen, d.readyTimeout, last)
		case <-poll.C:
			rewatch = true
			if url, done, err := read(); done {
				return url, err
			}
		case ev, ok := <-events:
			switch {
			case !ok || ev.Type == watch.Error:
				log.Debug("watch ended, restarting", "event", ev.Type)
				w.Stop()
				w, rewatch, rv = nil, false, "" // the next watch starts from the newest version
				if url, done, err := read(); done {
					return url, err
				}
			case ev.Type == watch.Deleted:
				return "", fmt.Errorf("%w: Knative Service %s/%s was deleted while waiting for it to become Ready", ErrNotReady, d.ns, name)
			default:
				if svc, isSvc := ev.Object.(*servingv1.Service); isSvc {
					if url, done, err := seen(svc); done {
						return url, err
					}
				}
			}
		}
	}
}
