package knative_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"
	servingv1client "knative.dev/serving/pkg/client/clientset/versioned/typed/serving/v1"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/deployer/knative"
)

const digestC = "registry.example/demo@sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

// beforeFirstUpdate wraps a clientset so that hook runs once, just before the first Service
// Update, i.e. after the deployer has read the Service and planned its write. It injects an
// interleaving (another writer in that window) that the real API server then answers with a
// real 409; the wrapper changes nothing else.
type beforeFirstUpdate struct {
	servingclientset.Interface
	hook func()
}

func (c *beforeFirstUpdate) ServingV1() servingv1client.ServingV1Interface {
	return hookV1{c.Interface.ServingV1(), c}
}

type hookV1 struct {
	servingv1client.ServingV1Interface
	c *beforeFirstUpdate
}

func (v hookV1) Services(ns string) servingv1client.ServiceInterface {
	return hookServices{v.ServingV1Interface.Services(ns), v.c}
}

type hookServices struct {
	servingv1client.ServiceInterface
	c *beforeFirstUpdate
}

func (s hookServices) Update(ctx context.Context, svc *servingv1.Service, o metav1.UpdateOptions) (*servingv1.Service, error) {
	if h := s.c.hook; h != nil {
		s.c.hook = nil
		h()
	}
	return s.ServiceInterface.Update(ctx, svc, o)
}

// withEnv returns r with env plus kv pairs.
func withEnv(r deployer.Release, kv ...string) deployer.Release {
	env := map[string]string{}
	for k, v := range r.Env {
		env[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	r.Env = env
	return r
}

// TestDeployFromFieldScoped: an operation planned on base v1 writes while another writer,
// planned on the same base, lands in between (after our read, before our write). Writes of
// different fields both land; a write of the same field fails with ErrFieldConflict and the
// other writer's value survives. Never a blind overwrite.
func TestDeployFromFieldScoped(t *testing.T) {
	v1 := release(digestA, commitA)
	v1.Version = 1
	push := release(digestB, commitB) // same env as v1
	push.Version = 2
	for _, tc := range []struct {
		name         string
		other, ours  deployer.Release
		wantConflict string // "" = both land
		wantImage    string
		wantEnv      map[string]string // variables that must have these values afterwards
	}{{
		name:      "push vs concurrent config change: both land",
		other:     withEnv(v1, "FOO", "1"),
		ours:      push,
		wantImage: digestB, wantEnv: map[string]string{"FOO": "1", "ALPHA": "first"},
	}, {
		name:      "config change vs concurrent push: both land",
		other:     push,
		ours:      withEnv(v1, "FOO", "1"),
		wantImage: digestB, wantEnv: map[string]string{"FOO": "1", "ALPHA": "first"},
	}, {
		name:      "config changes of different variables: both land",
		other:     withEnv(v1, "BAR", "2"),
		ours:      withEnv(v1, "FOO", "1"),
		wantImage: digestA, wantEnv: map[string]string{"FOO": "1", "BAR": "2"},
	}, {
		name:         "two pushes on the same base: second fails naming image",
		other:        release(digestC, commitB),
		ours:         push,
		wantConflict: "image",
		wantImage:    digestC,
	}, {
		name:         "config changes of the same variable: second fails",
		other:        withEnv(v1, "FOO", "2"),
		ours:         withEnv(v1, "FOO", "1"),
		wantConflict: "env FOO",
		wantImage:    digestA, wantEnv: map[string]string{"FOO": "2"},
	}, {
		name: "unset vs concurrent change of the same variable: fails",
		other: func() deployer.Release {
			r := withEnv(v1)
			r.Env["ALPHA"] = "changed"
			return r
		}(),
		ours: func() deployer.Release {
			r := withEnv(v1)
			delete(r.Env, "ALPHA")
			return r
		}(),
		wantConflict: "env ALPHA",
		wantImage:    digestA, wantEnv: map[string]string{"ALPHA": "changed"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			plain := f.deployer()
			if _, err := plain.Deploy(f.ctx, v1, &bytes.Buffer{}); err != nil {
				t.Fatalf("deploying v1: %v", err)
			}
			otherRan := false
			cs := &beforeFirstUpdate{Interface: f.cs, hook: func() {
				otherRan = true
				if _, _, err := plain.ApplyPlan(f.ctx, "demo", knative.PlanRelease(v1, tc.other)); err != nil {
					t.Errorf("other writer: %v", err)
				}
			}}
			d := knative.New(cs, f.ns, knative.WithLogger(slog.New(slog.NewTextHandler(f.logBuf, nil))), knative.WithPollInterval(200*time.Millisecond))
			var out bytes.Buffer
			_, err := d.DeployFrom(f.ctx, v1, tc.ours, &out)
			if !otherRan {
				t.Fatal("the other writer never ran: the test did not interleave")
			}
			got := f.get(t, "demo")
			if tc.wantConflict == "" {
				if err != nil {
					t.Fatalf("DeployFrom: %v\nlog:\n%s", err, f.logBuf)
				}
				if !strings.Contains(f.logBuf.String(), "conflicting write") {
					t.Errorf("no 409 was seen, the test did not exercise the conflict path:\n%s", f.logBuf)
				}
			} else {
				var fc *knative.FieldConflictError
				if !errors.Is(err, deployer.ErrFieldConflict) || !errors.As(err, &fc) || fc.Field != tc.wantConflict {
					t.Fatalf("DeployFrom = %v, want a FieldConflictError on %q", err, tc.wantConflict)
				}
				for _, want := range []string{tc.wantConflict, "planned on", "it is now", "kpush did not overwrite it"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q lacks %q", err, want)
					}
				}
			}
			if img := got.Spec.Template.Spec.Containers[0].Image; img != tc.wantImage {
				t.Errorf("image = %s, want %s", img, tc.wantImage)
			}
			env := map[string]string{}
			for _, e := range got.Spec.Template.Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			for k, v := range tc.wantEnv {
				if env[k] != v {
					t.Errorf("env %s = %q, want %q (env %v)", k, env[k], v, env)
				}
			}
		})
	}
}

// TestDeployFromStaleBase: the Service's image changed before the operation even read it
// (its base is stale): the first attempt already refuses, and nothing is written.
func TestDeployFromStaleBase(t *testing.T) {
	f := newFixture(t, true)
	d := f.deployer()
	v1 := release(digestA, commitA)
	if _, err := d.Deploy(f.ctx, v1, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.ApplyPlan(f.ctx, "demo", knative.PlanRelease(v1, release(digestC, commitB))); err != nil {
		t.Fatal(err)
	}
	gen := f.get(t, "demo").Generation
	_, err := d.DeployFrom(f.ctx, v1, release(digestB, commitB), &bytes.Buffer{})
	if !errors.Is(err, deployer.ErrFieldConflict) || !strings.Contains(err.Error(), digestC) || !strings.Contains(err.Error(), "git push") {
		t.Fatalf("DeployFrom on a stale base = %v, want ErrFieldConflict naming %s and the retry command", err, digestC)
	}
	if got := f.get(t, "demo"); got.Generation != gen || got.Spec.Template.Spec.Containers[0].Image != digestC {
		t.Errorf("Service written despite the conflict: generation %d (was %d), image %s", got.Generation, gen, got.Spec.Template.Spec.Containers[0].Image)
	}
}

// TestDeployNoBlindRetry: plain Deploy plans on its first read; if another writer changes
// the image between that read and the write, Deploy fails instead of overwriting it.
func TestDeployNoBlindRetry(t *testing.T) {
	f := newFixture(t, true)
	plain := f.deployer()
	v1 := release(digestA, commitA)
	if _, err := plain.Deploy(f.ctx, v1, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	cs := &beforeFirstUpdate{Interface: f.cs, hook: func() {
		if _, _, err := plain.ApplyPlan(f.ctx, "demo", knative.PlanRelease(v1, release(digestC, commitB))); err != nil {
			t.Errorf("other writer: %v", err)
		}
	}}
	d := knative.New(cs, f.ns, knative.WithPollInterval(200*time.Millisecond))
	_, err := d.Deploy(f.ctx, release(digestB, commitB), &bytes.Buffer{})
	if !errors.Is(err, deployer.ErrFieldConflict) {
		t.Fatalf("Deploy = %v, want ErrFieldConflict", err)
	}
	if img := f.get(t, "demo").Spec.Template.Spec.Containers[0].Image; img != digestC {
		t.Errorf("image = %s, want the other writer's %s", img, digestC)
	}
}

// TestApplyPlanTraffic: a traffic operation owns spec.traffic only; it lands next to a
// concurrent push, and fails against a concurrent traffic change.
func TestApplyPlanTraffic(t *testing.T) {
	latest, pct100, pct50 := true, int64(100), int64(50)
	split := []servingv1.TrafficTarget{{LatestRevision: &latest, Percent: &pct50}, {RevisionName: "demo-00001", Percent: &pct50}}
	pinned := []servingv1.TrafficTarget{{RevisionName: "demo-00001", Percent: &pct100}}
	v1 := release(digestA, commitA)
	for _, tc := range []struct {
		name         string
		other        knative.Plan
		wantConflict bool
	}{
		{"vs concurrent push", knative.PlanRelease(v1, release(digestB, commitB)), false},
		{"vs concurrent traffic change", knative.Plan{Traffic: &knative.Edit[[]servingv1.TrafficTarget]{To: pinned}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, false)
			plain := f.deployer()
			if _, _, err := plain.ApplyPlan(f.ctx, "demo", knative.PlanRelease(deployer.Release{}, v1)); err != nil {
				t.Fatal(err)
			}
			cs := &beforeFirstUpdate{Interface: f.cs, hook: func() {
				if _, _, err := plain.ApplyPlan(f.ctx, "demo", tc.other); err != nil {
					t.Errorf("other writer: %v", err)
				}
			}}
			d := knative.New(cs, f.ns)
			_, _, err := d.ApplyPlan(f.ctx, "demo", knative.Plan{Traffic: &knative.Edit[[]servingv1.TrafficTarget]{To: split}})
			got := f.get(t, "demo")
			if tc.wantConflict {
				if !errors.Is(err, deployer.ErrFieldConflict) || !strings.Contains(err.Error(), "traffic") {
					t.Fatalf("ApplyPlan = %v, want ErrFieldConflict on traffic", err)
				}
				if len(got.Spec.Traffic) != 1 || got.Spec.Traffic[0].RevisionName != "demo-00001" {
					t.Errorf("other writer's traffic lost: %+v", got.Spec.Traffic)
				}
				return
			}
			if err != nil {
				t.Fatalf("ApplyPlan: %v", err)
			}
			if len(got.Spec.Traffic) != 2 || got.Spec.Template.Spec.Containers[0].Image != digestB {
				t.Errorf("traffic %+v image %s; want the split and the push's %s", got.Spec.Traffic, got.Spec.Template.Spec.Containers[0].Image, digestB)
			}
		})
	}
}

// TestPlanRelease: what a release owns depends on what differs from its base.
func TestPlanRelease(t *testing.T) {
	v1 := release(digestA, commitA)
	for _, tc := range []struct {
		name       string
		base, r    deployer.Release
		image, env bool
		commit     bool
	}{
		{"first push", deployer.Release{}, v1, true, true, true},
		{"push, same env", v1, release(digestB, commitB), true, false, true},
		{"config change", v1, withEnv(v1, "FOO", "1"), false, true, false},
		{"same digest from another commit", v1, release(digestA, commitB), false, false, true},
		{"nothing differs", v1, v1, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := knative.PlanRelease(tc.base, tc.r)
			_, commit := p.Annotations[knative.AnnotationCommit]
			if (p.Image != nil) != tc.image || (p.Env != nil) != tc.env || commit != tc.commit {
				t.Errorf("owns image %v env %v commit annotation %v; want %v %v %v", p.Image != nil, p.Env != nil, commit, tc.image, tc.env, tc.commit)
			}
			if p.Annotations[knative.AnnotationApp] != "demo" {
				t.Errorf("annotations %v lack app", p.Annotations)
			}
		})
	}
}

// TestFieldConflictMatchesDeployerSentinel: a FieldConflictError, however deep it is wrapped,
// matches deployer.ErrFieldConflict (what the receiver checks, without importing this
// package) and keeps its message for people; the deployer's other errors, and an error that
// only says the same words, do not match.
func TestFieldConflictMatchesDeployerSentinel(t *testing.T) {
	fc := &knative.FieldConflictError{Namespace: "ns", Service: "demo", Field: "image",
		Planned: digestA, Now: digestC, Want: digestB, Retry: "git push again"}
	wrapped := fmt.Errorf("deploying v2 of demo: %w", fmt.Errorf("writing Knative Service ns/demo: %w", fc))
	if !errors.Is(wrapped, deployer.ErrFieldConflict) {
		t.Errorf("errors.Is(%q, deployer.ErrFieldConflict) = false", wrapped)
	}
	if got, ok := errors.AsType[*knative.FieldConflictError](wrapped); !ok || got != fc {
		t.Errorf("errors.As found %v, want the FieldConflictError", got)
	}
	want := "image of Knative Service ns/demo was changed by someone else while this operation ran: it was planned on " + digestA +
		", it is now " + digestC + " (this operation would set " + digestB + "); kpush did not overwrite it. " +
		"Check the change (`kubectl get ksvc demo -n ns -o yaml`), then git push again"
	if fc.Error() != want {
		t.Errorf("message = %q\nwant      %q", fc.Error(), want)
	}
	for _, err := range []error{
		knative.ErrConflict, knative.ErrNotReady, knative.ErrNotManaged, knative.ErrInvalidRelease,
		errors.New("image of Knative Service ns/demo was changed by someone else"),
	} {
		if errors.Is(err, deployer.ErrFieldConflict) {
			t.Errorf("errors.Is(%q, deployer.ErrFieldConflict) = true, want false", err)
		}
	}
}
