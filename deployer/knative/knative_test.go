package knative_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"
	servingv1client "knative.dev/serving/pkg/client/clientset/versioned/typed/serving/v1"

	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/deployer/knative"
	"kpush.dev/kpush/deployer/knativetest"
)

// cfg reaches one real kube-apiserver (with the Knative CRDs) shared by this package's
// tests; each test works in its own namespace.
var cfg *rest.Config

func TestMain(m *testing.M) { os.Exit(knativetest.Main(m, &cfg)) }

const (
	digestA = "registry.example/demo@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "registry.example/demo@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	commitA = "1111111111111111111111111111111111111111"
	commitB = "2222222222222222222222222222222222222222"
)

func release(image, commit string) deployer.Release {
	return deployer.Release{
		App: "demo", Image: image, Commit: commit, Pusher: "alice",
		Env: map[string]string{"ZED": "last", "ALPHA": "first", "MIDDLE": "m"},
	}
}

// fixture is one test's namespace, clientset, stand-in controller and captured log.
type fixture struct {
	ns      string
	cs      servingclientset.Interface
	standIn *knativetest.StandIn
	logBuf  *syncBuffer
	ctx     context.Context
}

func newFixture(t *testing.T, standIn bool) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{ns: knativetest.Namespace(t, cfg), cs: servingclientset.NewForConfigOrDie(cfg), logBuf: &syncBuffer{}, ctx: ctx}
	if standIn {
		f.standIn = knativetest.StartStandIn(ctx, t, f.cs, f.ns)
	}
	return f
}

func (f *fixture) deployer(opts ...knative.Option) *knative.Deployer {
	log := slog.New(slog.NewTextHandler(f.logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return knative.New(f.cs, f.ns, append([]knative.Option{knative.WithLogger(log), knative.WithPollInterval(200 * time.Millisecond)}, opts...)...)
}

func (f *fixture) get(t *testing.T, name string) *servingv1.Service {
	t.Helper()
	svc, err := f.cs.ServingV1().Services(f.ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading Service %s: %v", name, err)
	}
	return svc
}

func TestDeployCreates(t *testing.T) {
	f := newFixture(t, true)
	var out bytes.Buffer
	url, err := f.deployer().Deploy(f.ctx, release(digestA, commitA), &out)
	if err != nil {
		t.Fatalf("Deploy: %v\noutput:\n%s", err, out.String())
	}
	if want := "http://demo." + f.ns + ".example.com"; url != want {
		t.Errorf("url = %q, want %q", url, want)
	}
	svc := f.get(t, "demo")
	if svc.Generation != 1 {
		t.Errorf("generation = %d, want 1", svc.Generation)
	}
	if got := svc.Labels[knative.LabelManagedBy]; got != "kpush" {
		t.Errorf("label %s = %q, want kpush", knative.LabelManagedBy, got)
	}
	wantAnn := map[string]string{"kpush.dev/app": "demo", "kpush.dev/commit": commitA, "kpush.dev/pusher": "alice"}
	for k, v := range wantAnn {
		if got := svc.Annotations[k]; got != v {
			t.Errorf("Service annotation %s = %q, want %q", k, got, v)
		}
		if got := svc.Spec.Template.Annotations[k]; got != v {
			t.Errorf("template annotation %s = %q, want %q", k, got, v)
		}
	}
	c := svc.Spec.Template.Spec.Containers
	if len(c) != 1 || c[0].Image != digestA {
		t.Fatalf("containers = %+v, want one with image %s", c, digestA)
	}
	wantEnv := []corev1.EnvVar{{Name: "ALPHA", Value: "first"}, {Name: "MIDDLE", Value: "m"}, {Name: "ZED", Value: "last"}}
	if fmt.Sprint(c[0].Env) != fmt.Sprint(wantEnv) {
		t.Errorf("env = %v, want %v (sorted by name)", c[0].Env, wantEnv)
	}
	for _, want := range []string{"Service demo created (generation 1), waiting for Ready", "Ready: " + url} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDeployUpdatesByDigest(t *testing.T) {
	f := newFixture(t, true)
	d := f.deployer()
	if _, err := d.Deploy(f.ctx, release(digestA, commitA), &bytes.Buffer{}); err != nil {
		t.Fatalf("first Deploy: %v", err)
	}
	var out bytes.Buffer
	url, err := d.Deploy(f.ctx, release(digestB, commitB), &out)
	if err != nil {
		t.Fatalf("second Deploy: %v\noutput:\n%s", err, out.String())
	}
	svc := f.get(t, "demo")
	if svc.Generation != 2 || svc.Status.ObservedGeneration != 2 {
		t.Errorf("generation %d observed %d, want 2 and 2", svc.Generation, svc.Status.ObservedGeneration)
	}
	if got := svc.Spec.Template.Spec.Containers[0].Image; got != digestB {
		t.Errorf("image = %s, want %s", got, digestB)
	}
	if got := svc.Spec.Template.Annotations[knative.AnnotationCommit]; got != commitB {
		t.Errorf("template commit annotation = %s, want %s", got, commitB)
	}
	if url == "" || !strings.Contains(out.String(), "Service demo updated (generation 2)") {
		t.Errorf("url %q, output:\n%s", url, out.String())
	}

	// The same release again writes nothing and is Ready at once.
	out.Reset()
	if _, err := d.Deploy(f.ctx, release(digestB, commitB), &out); err != nil {
		t.Fatalf("third Deploy: %v", err)
	}
	if got := f.get(t, "demo"); got.Generation != 2 || got.ResourceVersion != svc.ResourceVersion {
		t.Errorf("identical redeploy wrote: generation %d rv %s, want 2 rv %s", got.Generation, got.ResourceVersion, svc.ResourceVersion)
	}
	if !strings.Contains(out.String(), "Service demo unchanged (generation 2)") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestApplyConflict makes another writer change the Service between Apply's read and its
// write (inside the first call of the mutation, which runs after the read): the API server
// answers the stale write with 409 Conflict, Apply re-reads and re-applies the release's
// fields, and the other writer's label and traffic survive.
func TestApplyConflict(t *testing.T) {
	f := newFixture(t, true)
	d := f.deployer()
	if _, err := d.Deploy(f.ctx, release(digestA, commitA), &bytes.Buffer{}); err != nil {
		t.Fatalf("first Deploy: %v", err)
	}

	calls := 0
	rel := knative.ReleaseMutation(release(digestB, commitB))
	svc, change, err := d.Apply(f.ctx, "demo", func(s *servingv1.Service) error {
		calls++
		if calls == 1 {
			f.otherWriter(t)
		}
		return rel(s)
	})
	if err != nil {
		t.Fatalf("Apply: %v\nlog:\n%s", err, f.logBuf)
	}
	if calls != 2 || change != knative.Updated {
		t.Errorf("mutation called %d times, change %q; want 2 (one conflict), updated", calls, change)
	}
	if !strings.Contains(f.logBuf.String(), "conflicting write") {
		t.Errorf("conflict not logged:\n%s", f.logBuf)
	}
	got := f.get(t, "demo")
	if svc.Generation != 3 || got.Generation != 3 { // 1 create, 2 other writer, 3 this release
		t.Errorf("generation returned %d, stored %d; want 3", svc.Generation, got.Generation)
	}
	if got.Labels["team"] != "payments" {
		t.Errorf("other writer's label lost: labels %v", got.Labels)
	}
	if len(got.Spec.Traffic) != 1 || got.Spec.Traffic[0].Tag != "current" {
		t.Errorf("other writer's traffic lost: %+v", got.Spec.Traffic)
	}
	if img := got.Spec.Template.Spec.Containers[0].Image; img != digestB {
		t.Errorf("image = %s, want %s", img, digestB)
	}
	if c := got.Annotations[knative.AnnotationCommit]; c != commitB {
		t.Errorf("commit annotation = %s, want %s", c, commitB)
	}
}

// otherWriter adds a label and a traffic block to Service demo, as a person with kubectl or
// another controller would.
func (f *fixture) otherWriter(t *testing.T) {
	t.Helper()
	svc := f.get(t, "demo")
	svc.Labels["team"] = "payments"
	latest, pct := true, int64(100)
	svc.Spec.Traffic = []servingv1.TrafficTarget{{Tag: "current", LatestRevision: &latest, Percent: &pct}}
	if _, err := f.cs.ServingV1().Services(f.ns).Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("other writer: %v", err)
	}
}

func TestApplyConflictBounded(t *testing.T) {
	f := newFixture(t, false)
	d := f.deployer(knative.WithMaxWriteAttempts(3))
	if _, _, err := d.Apply(f.ctx, "demo", knative.ReleaseMutation(release(digestA, commitA))); err != nil {
		t.Fatalf("create: %v", err)
	}
	calls := 0
	rel := knative.ReleaseMutation(release(digestB, commitB))
	_, _, err := d.Apply(f.ctx, "demo", func(s *servingv1.Service) error {
		calls++
		svc := f.get(t, "demo")
		svc.Labels["touched"] = fmt.Sprint(calls)
		if _, err := f.cs.ServingV1().Services(f.ns).Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("other writer: %v", err)
		}
		return rel(s)
	})
	if !errors.Is(err, knative.ErrConflict) || !apierrors.IsConflict(err) {
		t.Fatalf("err = %v, want ErrConflict wrapping the 409", err)
	}
	if calls != 3 {
		t.Errorf("mutation called %d times, want 3", calls)
	}
	if img := f.get(t, "demo").Spec.Template.Spec.Containers[0].Image; img != digestA {
		t.Errorf("image = %s after failed apply, want %s", img, digestA)
	}
}

func TestDeployNotReady(t *testing.T) {
	f := newFixture(t, true)
	f.standIn.Set("demo", knativetest.Outcome{Status: corev1.ConditionFalse, Reason: "RevisionFailed", Message: "Revision \"demo-00001\" failed with message: container exited."})
	var out bytes.Buffer
	url, err := f.deployer().Deploy(f.ctx, release(digestA, commitA), &out)
	if !errors.Is(err, knative.ErrNotReady) {
		t.Fatalf("Deploy = %q, %v; want ErrNotReady", url, err)
	}
	for _, want := range []string{"RevisionFailed", "container exited", "kubectl describe ksvc demo -n " + f.ns} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestDeployTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		standIn *knativetest.Outcome // nil: no controller at all
		want    []string
	}{
		{"no controller", nil, []string{"timed out after 1s", "has not yet observed generation 1"}},
		{"stuck deploying", &knativetest.Outcome{Status: corev1.ConditionUnknown, Reason: "Deploying", Message: "waiting for pods"},
			[]string{"timed out after 1s", "Ready=Unknown (Deploying: waiting for pods)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.standIn != nil)
			if tc.standIn != nil {
				f.standIn.Set("demo", *tc.standIn)
			}
			var out bytes.Buffer
			start := time.Now()
			_, err := f.deployer(knative.WithReadyTimeout(time.Second)).Deploy(f.ctx, release(digestA, commitA), &out)
			if !errors.Is(err, knative.ErrReadyTimeout) {
				t.Fatalf("err = %v, want ErrReadyTimeout", err)
			}
			if el := time.Since(start); el < time.Second {
				t.Errorf("returned after %s, before the 1s timeout", el)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
			if tc.standIn != nil && !strings.Contains(out.String(), "Ready=Unknown (Deploying") {
				t.Errorf("progress lacks the condition:\n%s", out.String())
			}
		})
	}
}

func TestDeployRefusesInvalidRelease(t *testing.T) {
	f := newFixture(t, false)
	for _, tc := range []struct {
		name string
		edit func(*deployer.Release)
		want string
	}{
		{"tag", func(r *deployer.Release) { r.Image = "registry.example/demo:latest" }, "not a digest"},
		{"bare repository", func(r *deployer.Release) { r.Image = "registry.example/demo" }, "not a digest"},
		{"short digest", func(r *deployer.Release) { r.Image = "registry.example/demo@sha256:abc" }, "not a digest"},
		{"empty image", func(r *deployer.Release) { r.Image = "" }, "not a digest"},
		{"app not DNS-1035", func(r *deployer.Release) { r.App = "Demo_App" }, "app name"},
		{"reserved PORT", func(r *deployer.Release) { r.Env["PORT"] = "8080" }, "PORT is set by Knative"},
		{"bad env name", func(r *deployer.Release) { r.Env["1X"] = "y" }, `"1X"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := release(digestA, commitA)
			tc.edit(&r)
			_, err := f.deployer().Deploy(f.ctx, r, &bytes.Buffer{})
			if !errors.Is(err, knative.ErrInvalidRelease) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidRelease containing %q", err, tc.want)
			}
		})
	}
	list, err := f.cs.ServingV1().Services(f.ns).List(f.ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("Services after refused deploys: %d (err %v), want none", len(list.Items), err)
	}
}

func TestDeployRefusesUnmanaged(t *testing.T) {
	f := newFixture(t, true)
	foreign := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: f.ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "helm"}}}
	foreign.Spec.Template.Spec.Containers = []corev1.Container{{Image: "registry.example/other@sha256:" + strings.Repeat("c", 64)}}
	if _, err := f.cs.ServingV1().Services(f.ns).Create(f.ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating foreign Service: %v", err)
	}
	_, err := f.deployer().Deploy(f.ctx, release(digestA, commitA), &bytes.Buffer{})
	if !errors.Is(err, knative.ErrNotManaged) {
		t.Fatalf("err = %v, want ErrNotManaged", err)
	}
	for _, want := range []string{"not created by kpush", "kubectl delete ksvc demo -n " + f.ns} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if got := f.get(t, "demo"); got.Generation != 1 || got.Spec.Template.Spec.Containers[0].Image != foreign.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("foreign Service was changed: generation %d, image %s", got.Generation, got.Spec.Template.Spec.Containers[0].Image)
	}
}

// TestDeployPollFallback waits for Ready through a clientset whose Watch always fails: a
// fault the real API server does not produce on demand, injected by the wrapper below. The
// Service becomes Ready only after the watch has failed, so only the poll can see it.
func TestDeployPollFallback(t *testing.T) {
	f := newFixture(t, true)
	f.standIn.Set("demo", knativetest.Outcome{Status: corev1.ConditionUnknown, Reason: "Deploying"})
	log := slog.New(slog.NewTextHandler(f.logBuf, nil))
	d := knative.New(noWatch{f.cs}, f.ns, knative.WithLogger(log), knative.WithPollInterval(100*time.Millisecond), knative.WithReadyTimeout(30*time.Second))
	type result struct {
		url string
		err error
	}
	done := make(chan result, 1)
	go func() {
		url, err := d.Deploy(f.ctx, release(digestA, commitA), &bytes.Buffer{})
		done <- result{url, err}
	}()
	for !strings.Contains(f.logBuf.String(), "polling instead") {
		select {
		case r := <-done:
			t.Fatalf("Deploy returned %q, %v before its watch failed; log:\n%s", r.url, r.err, f.logBuf)
		case <-f.ctx.Done():
			t.Fatalf("watch failure never logged:\n%s", f.logBuf)
		case <-time.After(20 * time.Millisecond):
		}
	}
	f.standIn.Set("demo", knativetest.Ready)
	r := <-done
	if r.err != nil {
		t.Fatalf("Deploy: %v", r.err)
	}
	if r.url != "http://demo."+f.ns+".example.com" {
		t.Errorf("url = %q", r.url)
	}
}

// noWatch is the real clientset except that Services(ns).Watch fails.
type noWatch struct{ servingclientset.Interface }

func (c noWatch) ServingV1() servingv1client.ServingV1Interface {
	return noWatchV1{c.Interface.ServingV1()}
}

type noWatchV1 struct {
	servingv1client.ServingV1Interface
}

func (c noWatchV1) Services(ns string) servingv1client.ServiceInterface {
	return noWatchServices{c.ServingV1Interface.Services(ns)}
}

type noWatchServices struct {
	servingv1client.ServiceInterface
}

func (noWatchServices) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return nil, errors.New("injected: watch unavailable")
}

// syncBuffer is a bytes.Buffer safe for the logger and the test to use concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
