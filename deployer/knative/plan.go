package knative

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"kpush.dev/kpush/deployer"
)

// Edit is one owned field: the value the operation was planned on (From, its base) and the
// value it writes (To).
type Edit[T any] struct {
	From, To T
}

// Plan is a field-scoped write to a Service: the fields it owns, each with its base, plus
// annotations that ride along. A nil field is not owned and never written. ApplyPlan checks
// every owned field against its base on every attempt (the first included):
//
//   - current value equal to To: nothing to do for that field;
//   - current value equal to From: set To;
//   - anything else: another writer changed that same field since the base, and ApplyPlan
//     fails with a *FieldConflictError (deployer.ErrFieldConflict) without writing.
//
// Fields are spec.template.spec.containers[0].image (Image),
// spec.template.spec.containers[0].env (Env: owned per variable, only the variables whose
// presence or value differs between From and To; the others, and variables taken from
// secrets or config maps, are left alone) and spec.traffic (Traffic, compared as a whole).
// Annotations (on the Service and its revision template, as AnnotationsMutation) are set on
// every attempt without a base check: they describe the write itself (last writer wins).
type Plan struct {
	Image       *Edit[string]
	Env         *Edit[map[string]string]
	Traffic     *Edit[[]servingv1.TrafficTarget]
	Annotations map[string]string
}

// FieldConflictError says which owned field another writer changed since the operation's
// base, and to what. It wraps deployer.ErrFieldConflict, so callers that do not import this
// package (the receiver) recognise it with errors.Is.
type FieldConflictError struct {
	Namespace, Service string
	// Field is "image", "env <NAME>" or "traffic".
	Field string
	// Planned is the field's value the operation was planned on, Now its current value and
	// Want what the operation would have written ("(unset)" for an absent env variable).
	Planned, Now, Want string
	// Retry is the command that plans the operation again, for people.
	Retry string
}

func (e *FieldConflictError) Error() string {
	return fmt.Sprintf("%s of Knative Service %s/%s was changed by someone else while this operation ran: it was planned on %s, it is now %s (this operation would set %s); kpush did not overwrite it. Check the change (`kubectl get ksvc %s -n %s -o yaml`), then %s",
		e.Field, e.Namespace, e.Service, e.Planned, e.Now, e.Want, e.Service, e.Namespace, e.Retry)
}

// Unwrap returns deployer.ErrFieldConflict: errors.Is(err, deployer.ErrFieldConflict) is true.
func (e *FieldConflictError) Unwrap() error { return deployer.ErrFieldConflict }

var _ deployer.BaseDeployer = (*Deployer)(nil)

// DeployFrom is Deploy with an explicit base: base is the release the operation was planned
// on (what the caller believed to be serving when it decided on r; the zero Release when it
// believed nothing was deployed yet). It owns only what differs between base and r (see
// PlanRelease): a push owns the image, a config change owns the variables it sets or unsets,
// so the two can run concurrently and both land. If another writer changed an owned field
// since base, it fails with a *FieldConflictError (deployer.ErrFieldConflict) and writes nothing.
// Other errors as for Deploy.
func (d *Deployer) DeployFrom(ctx context.Context, base, r deployer.Release, out io.Writer) (string, error) {
	return d.deploy(ctx, &base, r, out)
}

// deploy writes r (planned on base; nil: on the Service as first read) and waits for Ready.
func (d *Deployer) deploy(ctx context.Context, base *deployer.Release, r deployer.Release, out io.Writer) (string, error) {
	if err := ValidateRelease(r); err != nil {
		return "", err
	}
	log := d.log.With("app", r.App, "commit", r.Commit, "image", r.Image)
	var planFor func(*servingv1.Service) Plan
	if base != nil {
		p := PlanRelease(*base, r)
		planFor = func(*servingv1.Service) Plan { return p }
	} else {
		planFor = func(cur *servingv1.Service) Plan { return PlanRelease(releaseOf(cur), r) }
	}
	svc, change, err := d.applyPlan(ctx, r.App, planFor)
	if err != nil {
		return "", err
	}
	log.Info("service written", "change", change, "generation", svc.Generation, "resource_version", svc.ResourceVersion)
	fmt.Fprintf(out, "       Service %s %s (generation %d), waiting for Ready…\n", r.App, change, svc.Generation)
	url, err := d.WaitReady(ctx, r.App, svc.Generation, out)
	if err != nil {
		log.Warn("service not ready", "generation", svc.Generation, "err", err)
		return "", err
	}
	log.Info("service ready", "generation", svc.Generation, "url", url)
	fmt.Fprintf(out, "       Ready: %s\n", url)
	return url, nil
}

// releaseOf is the release a Service runs now, as far as PlanRelease goes: image and plain
// env of containers[0], commit from its annotation; the zero Release for nil.
func releaseOf(s *servingv1.Service) deployer.Release {
	var r deployer.Release
	if s == nil {
		return r
	}
	r.Commit = s.Annotations[AnnotationCommit]
	if len(s.Spec.Template.Spec.Containers) == 0 {
		return r
	}
	c := s.Spec.Template.Spec.Containers[0]
	r.Image = c.Image
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			if r.Env == nil {
				r.Env = map[string]string{}
			}
			r.Env[e.Name] = e.Value
		}
	}
	return r
}

// PlanRelease is the Plan that moves a Service from base to r: the image is owned when it
// differs, the environment variables that differ are owned one by one, annotations
// kpush.dev/commit and kpush.dev/pusher ride along when the image or the commit differs (so a
// config change never rewrites the commit a concurrent push wrote), and kpush.dev/app and,
// when r.Version > 0, kpush.dev/release ("v<N>", last writer wins) ride along always.
func PlanRelease(base, r deployer.Release) Plan {
	p := Plan{Annotations: map[string]string{AnnotationApp: r.App}}
	if r.Version > 0 {
		p.Annotations[AnnotationRelease] = "v" + strconv.Itoa(r.Version)
	}
	if base.Image != r.Image {
		p.Image = &Edit[string]{From: base.Image, To: r.Image}
	}
	if base.Image != r.Image || base.Commit != r.Commit {
		p.Annotations[AnnotationCommit] = r.Commit
		p.Annotations[AnnotationPusher] = r.Pusher
	}
	if !maps.Equal(base.Env, r.Env) {
		p.Env = &Edit[map[string]string]{From: base.Env, To: r.Env}
	}
	return p
}

// ApplyPlan writes p to the Service name like Apply does (read, change a copy, write with the
// resourceVersion read, create if missing; ErrNotManaged, ErrConflict, Unchanged as there),
// but on a 409 it re-reads and re-applies only p's owned fields after checking each against
// its base (see Plan): a field someone else changed since the base fails the whole write with
// a *FieldConflictError; a change to any other field is kept. It never retries a whole
// object blindly.
func (d *Deployer) ApplyPlan(ctx context.Context, name string, p Plan) (*servingv1.Service, Change, error) {
	return d.applyPlan(ctx, name, func(*servingv1.Service) Plan { return p })
}

// applyPlan calls planFor once, with the Service as first read (nil if missing).
func (d *Deployer) applyPlan(ctx context.Context, name string, planFor func(*servingv1.Service) Plan) (*servingv1.Service, Change, error) {
	var (
		p       Plan
		planned bool
	)
	return d.write(ctx, name, func(cur, next *servingv1.Service, exists bool, attempt int) error {
		if !planned {
			var first *servingv1.Service
			if exists {
				first = cur
			}
			p, planned = planFor(first), true
		}
		if err := p.apply(d.ns, name, cur, next); err != nil {
			d.log.Warn("owned field changed by another writer", "app", name, "err", err, "attempt", attempt)
			return err
		}
		return nil
	})
}

// apply checks p's owned fields of cur against their bases and sets them on next (a copy of
// cur). It changes nothing on next when nothing owned needs writing.
func (p Plan) apply(ns, name string, cur, next *servingv1.Service) error {
	conflict := func(field, planned, now, want, retry string) error {
		return &FieldConflictError{Namespace: ns, Service: name, Field: field, Planned: planned, Now: now, Want: want, Retry: retry}
	}
	curC := containerOrNil(cur)
	if e := p.Image; e != nil {
		now := ""
		if curC != nil {
			now = curC.Image
		}
		switch now {
		case e.To:
		case e.From:
			firstContainer(next).Image = e.To
		default:
			return conflict("image", quoted(e.From), quoted(now), quoted(e.To), "push again (`git push`) to deploy your commit over it")
		}
	}
	if e := p.Env; e != nil {
		var curEnv []corev1.EnvVar
		if curC != nil {
			curEnv = curC.Env
		}
		for _, k := range slices.Sorted(maps.Keys(union(e.From, e.To))) {
			from, fromOK := e.From[k]
			to, toOK := e.To[k]
			if fromOK == toOK && from == to {
				continue // not owned
			}
			now, nowOK, plain := lookupEnv(curEnv, k)
			switch {
			case plain && nowOK == toOK && now == to:
			case plain && nowOK == fromOK && now == from:
				c := firstContainer(next)
				c.Env = setEnv(c.Env, k, to, toOK)
			default:
				nowS := envString(now, nowOK)
				if !plain {
					nowS = "taken from a secret or config map (valueFrom)"
				}
				retry := fmt.Sprintf("check it (`config %s`) and run `config:set %s %s=…` again", name, name, k)
				return conflict("env "+k, envString(from, fromOK), nowS, envString(to, toOK), retry)
			}
		}
	}
	if e := p.Traffic; e != nil {
		now := cur.Spec.Traffic
		switch {
		case sameTraffic(now, e.To):
		case sameTraffic(now, e.From):
			next.Spec.Traffic = slices.Clone(e.To)
		default:
			return conflict("traffic", fmt.Sprint(trafficString(e.From)), trafficString(now), trafficString(e.To), "run the traffic command again")
		}
	}
	return AnnotationsMutation(p.Annotations)(next)
}

func containerOrNil(s *servingv1.Service) *corev1.Container {
	if len(s.Spec.Template.Spec.Containers) == 0 {
		return nil
	}
	return &s.Spec.Template.Spec.Containers[0]
}

func union(a, b map[string]string) map[string]string {
	u := maps.Clone(a)
	if u == nil {
		u = map[string]string{}
	}
	maps.Copy(u, b)
	return u
}

// lookupEnv returns the value of k in env (the last entry wins, as in a container), whether
// it is there, and whether it is a plain value (not valueFrom).
func lookupEnv(env []corev1.EnvVar, k string) (value string, ok, plain bool) {
	plain = true
	for _, e := range env {
		if e.Name == k {
			value, ok, plain = e.Value, true, e.ValueFrom == nil
		}
	}
	return value, ok, plain
}

// setEnv sets k to v (or removes it when !ok) where k was first, or appends it in name order
// after the last name that sorts before it.
func setEnv(env []corev1.EnvVar, k, v string, ok bool) []corev1.EnvVar {
	at := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == k })
	env = slices.DeleteFunc(slices.Clone(env), func(e corev1.EnvVar) bool { return e.Name == k })
	if !ok {
		if len(env) == 0 {
			return nil
		}
		return env
	}
	if at < 0 {
		at = len(env)
		for i, e := range env {
			if e.Name > k {
				at = i
				break
			}
		}
	}
	return slices.Insert(env, at, corev1.EnvVar{Name: k, Value: v})
}

func envString(v string, ok bool) string {
	if !ok {
		return "(unset)"
	}
	return quoted(v)
}

func quoted(s string) string {
	if s == "" {
		return "(none)"
	}
	return strconv.Quote(s)
}

func sameTraffic(a, b []servingv1.TrafficTarget) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return equality.Semantic.DeepEqual(a, b)
}

func trafficString(t []servingv1.TrafficTarget) string {
	if len(t) == 0 {
		return "(default: 100% latest)"
	}
	s := ""
	for i, tt := range t {
		if i > 0 {
			s += ", "
		}
		target := tt.RevisionName
		if tt.LatestRevision != nil && *tt.LatestRevision {
			target = "latest"
		}
		pct := "?"
		if tt.Percent != nil {
			pct = strconv.FormatInt(*tt.Percent, 10)
		}
		s += pct + "% " + target
		if tt.Tag != "" {
			s += " (tag " + tt.Tag + ")"
		}
	}
	return s
}
