//go:build linux

// Package knative_test checks the Knative Services kpush writes against the real Knative
// Serving v0.50.0 controller and webhook (built from source by `make tools`), running against
// a real kube-apiserver in a private network namespace — the acceptance that a stand-in
// controller (deployer/knativetest.StandIn) cannot give.
//
// It lives in its own package because it re-executes its test binary under unshare
// (knativetest.InPrivateNetwork) and runs real buildpack builds: the deployer/knative unit
// tests stay fast and free of those.
package knative_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"knative.dev/serving/pkg/apis/serving"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/deployer/knative"
	"kpush.dev/kpush/deployer/knativetest"
	"kpush.dev/kpush/internal/tools"
)

// TestRealServingReconcilesKpushService builds an app with the real lifecycle into a real
// registry, writes its Service through kpush's own code path (knative.Deployer.Apply with
// ReleaseMutation), and checks that Knative's real webhook defaults it and its real controller
// reconciles it into a Configuration, a Route and a Revision (and the Revision's Deployment)
// running exactly the digest the registry holds — for a create and for an update. It also
// checks that the webhook, not only the CRD schema, is in the write path: a Service with a
// reserved env name is rejected, on create and on update.
func TestRealServingReconcilesKpushService(t *testing.T) {
	if !knativetest.InPrivateNetwork(t) {
		return
	}
	for _, n := range []string{"kube-apiserver", "etcd", "knative-controller", "knative-webhook", "lifecycle", "launcher", "bwrap", "busybox"} {
		if _, err := tools.Path(n); err != nil {
			t.Fatalf("tool %s missing (run make tools): %v", n, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	cfg := knativetest.Start(t)
	knativetest.StartServing(t, cfg)
	ns := knativetest.Namespace(t, cfg)
	cs := servingclientset.NewForConfigOrDie(cfg)
	kc := kubernetes.NewForConfigOrDie(cfg)

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	repo := strings.TrimPrefix(reg.URL, "http://") + "/kpush/hello"
	builder := &buildpack.Local{DataDir: t.TempDir()}

	d := knative.New(cs, ns)
	first := deployer.Release{
		App: "hello", Image: build(ctx, t, builder, repo, "v1"),
		Commit: strings.Repeat("a", 40), Pusher: "alice", Env: map[string]string{"GREETING": "v1"}, Version: 1,
	}
	if err := knative.ValidateRelease(first); err != nil {
		t.Fatalf("kpush refuses its own release: %v", err)
	}
	svc, change, err := d.Apply(ctx, first.App, knative.ReleaseMutation(first))
	if err != nil {
		t.Fatalf("writing the Service of %s: %v", first.Image, err)
	}
	if change != knative.Created {
		t.Errorf("Apply = %s, want %s", change, knative.Created)
	}
	checkDefaulted(t, svc)

	rev := waitRevision(ctx, t, cs, ns, "hello-00001")
	checkRevision(t, rev, first)
	checkDeployment(ctx, t, kc, ns, rev, first.Image)
	conf, err := cs.ServingV1().Configurations(ns).Get(ctx, "hello", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the controller created no Configuration for the Service: %v", err)
	}
	if !metav1.IsControlledBy(conf, svc) {
		t.Errorf("Configuration hello is not controlled by Service hello: owners %+v", conf.OwnerReferences)
	}
	route, err := cs.ServingV1().Routes(ns).Get(ctx, "hello", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the controller created no Route for the Service: %v", err)
	}
	if !metav1.IsControlledBy(route, svc) {
		t.Errorf("Route hello is not controlled by Service hello: owners %+v", route.OwnerReferences)
	}

	// The next release of the same app: a new build, a new generation, a new Revision.
	second := first
	second.Image = build(ctx, t, builder, repo, "v2")
	second.Commit, second.Env, second.Version = strings.Repeat("b", 40), map[string]string{"GREETING": "v2"}, 2
	if second.Image == first.Image {
		t.Fatalf("two builds of different sources gave the same image %s", first.Image)
	}
	svc, change, err = d.Apply(ctx, second.App, knative.ReleaseMutation(second))
	if err != nil {
		t.Fatalf("updating the Service to %s: %v", second.Image, err)
	}
	if change != knative.Updated || svc.Generation != 2 {
		t.Errorf("Apply = %s at generation %d, want %s at generation 2", change, svc.Generation, knative.Updated)
	}
	rev = waitRevision(ctx, t, cs, ns, "hello-00002")
	checkRevision(t, rev, second)
	checkDeployment(ctx, t, kc, ns, rev, second.Image)

	// The webhook rejects what the CRD schema lets through: K_SERVICE and PORT are reserved
	// (knative.dev/serving pkg/apis/serving/k8s_validation.go). kpush's ValidateRelease refuses
	// them before writing; Apply does not, so here they reach the API server.
	bad := first
	bad.App, bad.Env = "rejected", map[string]string{"K_SERVICE": "x"}
	if err := knative.ValidateRelease(bad); !errors.Is(err, knative.ErrInvalidRelease) {
		t.Errorf("ValidateRelease(env K_SERVICE) = %v, want ErrInvalidRelease like the webhook", err)
	}
	_, _, err = d.Apply(ctx, bad.App, knative.ReleaseMutation(bad))
	checkDenied(t, err, "K_SERVICE")
	if _, err := cs.ServingV1().Services(ns).Get(ctx, bad.App, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the rejected Service exists after all (get: %v)", err)
	}
	_, _, err = d.Apply(ctx, second.App, knative.EnvMutation(map[string]string{"PORT": "9000"}))
	checkDenied(t, err, "PORT")
	svc, err = cs.ServingV1().Services(ns).Get(ctx, second.App, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Generation != 2 || svc.Spec.Template.Spec.Containers[0].Image != second.Image {
		t.Errorf("after the rejected update: generation %d image %s, want generation 2 image %s",
			svc.Generation, svc.Spec.Template.Spec.Containers[0].Image, second.Image)
	}
}

// build builds a Procfile app serving index.html (content greeting) with the real lifecycle
// and returns the image by digest, after checking that the registry holds that digest.
func build(ctx context.Context, t *testing.T, b *buildpack.Local, repo, greeting string) string {
	t.Helper()
	src := t.TempDir()
	files := map[string]string{
		"Procfile":          "web: busybox httpd -f -p $PORT -h public\n",
		"public/index.html": greeting + "\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	res, err := b.Build(ctx, buildpack.Request{App: "hello", SourceDir: src, Image: repo}, &out)
	if err != nil {
		t.Fatalf("building the app: %v\n%s", err, out.String())
	}
	ref, err := name.NewDigest(res.Image)
	if err != nil {
		t.Fatalf("build result %q is not a digest reference: %v", res.Image, err)
	}
	desc, err := remote.Head(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("the registry does not hold the built image %s: %v", res.Image, err)
	}
	if desc.Digest.String() != ref.DigestStr() {
		t.Fatalf("registry digest %s != build result %s", desc.Digest, res.Image)
	}
	return res.Image
}

// checkDefaulted checks fields only Knative's defaulting webhook sets (v0.50.0
// pkg/apis/serving/v1/revision_defaults.go, service_defaults.go) on the Service as the API
// server answered the create.
func checkDefaulted(t *testing.T, svc *servingv1.Service) {
	t.Helper()
	spec := svc.Spec.Template.Spec
	c := spec.Containers[0]
	if c.Name != "user-container" {
		t.Errorf("containers[0].name = %q, want the webhook's default user-container", c.Name)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.TCPSocket == nil || c.ReadinessProbe.SuccessThreshold != 1 {
		t.Errorf("containers[0].readinessProbe = %+v, want the webhook's default TCP probe with successThreshold 1", c.ReadinessProbe)
	}
	if spec.TimeoutSeconds == nil || *spec.TimeoutSeconds != 300 {
		t.Errorf("timeoutSeconds = %v, want the default 300", spec.TimeoutSeconds)
	}
	if spec.ContainerConcurrency == nil || *spec.ContainerConcurrency != 0 {
		t.Errorf("containerConcurrency = %v, want the default 0", spec.ContainerConcurrency)
	}
	if svc.Annotations[serving.CreatorAnnotation] == "" {
		t.Errorf("annotation %s missing: the webhook records who created the Service", serving.CreatorAnnotation)
	}
}

func waitRevision(ctx context.Context, t *testing.T, cs servingclientset.Interface, ns, name string) *servingv1.Revision {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		rev, err := cs.ServingV1().Revisions(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return rev
		}
		select {
		case <-ctx.Done():
			revs, _ := cs.ServingV1().Revisions(ns).List(context.Background(), metav1.ListOptions{})
			var names []string
			for _, r := range revs.Items {
				names = append(names, r.Name)
			}
			t.Fatalf("the Knative controller created no Revision %s in 90 s (last error %v; revisions %v)", name, err, names)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkRevision checks that rev runs exactly r's image and carries r's env and annotations.
func checkRevision(t *testing.T, rev *servingv1.Revision, r deployer.Release) {
	t.Helper()
	c := rev.Spec.Containers[0]
	if c.Image != r.Image {
		t.Errorf("Revision %s image = %s, want the build's digest %s", rev.Name, c.Image, r.Image)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "GREETING" || c.Env[0].Value != r.Env["GREETING"] {
		t.Errorf("Revision %s env = %+v, want GREETING=%s", rev.Name, c.Env, r.Env["GREETING"])
	}
	if got := rev.Annotations[knative.AnnotationCommit]; got != r.Commit {
		t.Errorf("Revision %s annotation %s = %q, want %q", rev.Name, knative.AnnotationCommit, got, r.Commit)
	}
	if got := rev.Labels[serving.ServiceLabelKey]; got != r.App {
		t.Errorf("Revision %s label %s = %q, want %q", rev.Name, serving.ServiceLabelKey, got, r.App)
	}
}

// checkDeployment waits for the Deployment the controller makes for rev and checks that its
// user container runs image.
func checkDeployment(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns string, rev *servingv1.Revision, image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	name := rev.Name + "-deployment"
	for {
		dep, err := kc.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range dep.Spec.Template.Spec.Containers {
				if c.Name == "user-container" {
					if c.Image != image {
						t.Errorf("Deployment %s runs %s, want %s", name, c.Image, image)
					}
					return
				}
			}
			t.Errorf("Deployment %s has no user-container: %+v", name, dep.Spec.Template.Spec.Containers)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the Knative controller created no Deployment %s in 90 s: %v", name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkDenied checks that err is Knative's validation webhook refusing the write because of
// the env name reserved.
func checkDenied(t *testing.T, err error, reserved string) {
	t.Helper()
	if err == nil {
		t.Errorf("a Service with env %s was accepted; Knative's webhook rejects it", reserved)
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, `admission webhook "validation.webhook.serving.knative.dev" denied the request`) || !strings.Contains(msg, reserved) {
		t.Errorf("writing a Service with env %s: %v; want the validation webhook's denial naming %s", reserved, err, reserved)
	}
}
