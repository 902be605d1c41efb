package test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestServePushDeploysKnativeService is cluster mode end to end: `kpush serve` with the
// knative deployer against a real kube-apiserver with the Knative Serving CRDs. Knative's
// controller is not running; knativetest.StandIn stands in for it and marks Services Ready.
// The Service must carry exactly the digest the registry holds for the build.
func TestServePushDeploysKnativeService(t *testing.T) {
	c := startCluster(t)
	ctx, cs, ns, registry := c.ctx, c.cs, c.ns, c.registry
	dir := t.TempDir()
	key := sshKey(t, dir, "bob")
	s := c.serve(t, filepath.Join(dir, "data"), key)
	env := gitEnv(key)

	work := workTree(t, env, "goweb")
	commit := git(t, env, work, "rev-parse", "HEAD")
	git(t, env, work, "remote", "add", "knative", s.remote("goweb"))
	out, code := push(t, env, work, "knative", "main")
	if code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, out)
	}
	wantURL := "http://goweb." + ns + ".example.com"
	if got := printedURL(t, out); got != wantURL {
		t.Errorf("printed URL = %q, want the Service's status.url %q", got, wantURL)
	}

	svc, err := cs.ServingV1().Services(ns).Get(ctx, "goweb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := svc.Spec.Template.Spec.Containers[0].Image
	digest, err := name.NewDigest(image)
	if err != nil {
		t.Fatalf("Service image %q is not a digest reference: %v", image, err)
	}
	if want := registry + "/goweb"; digest.Context().String() != want {
		t.Errorf("Service image repository = %s, want %s", digest.Context(), want)
	}
	// The registry holds exactly one build of goweb, under its per-build tag, and the
	// Service carries that manifest's digest.
	repo := digest.Context()
	tags, err := remote.List(repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 1 {
		t.Fatalf("registry tags for %s = %v, want one per build", repo, tags)
	}
	desc, err := remote.Head(repo.Tag(tags[0]))
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != digest.DigestStr() {
		t.Errorf("Service digest %s != registry's %s for tag %s", digest.DigestStr(), desc.Digest, tags[0])
	}
	if got := svc.Annotations["kpush.dev/commit"]; got != commit {
		t.Errorf("kpush.dev/commit = %q, want %s", got, commit)
	}
	if got := svc.Annotations["kpush.dev/pusher"]; !strings.Contains(got, "bob") {
		t.Errorf("kpush.dev/pusher = %q, want bob", got)
	}
}
