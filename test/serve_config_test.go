package test

import (
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestServeConfigSetNewRevision is config:set in cluster mode: `kpush serve` against a real
// kube-apiserver with the Knative CRDs (knativetest.StandIn marks Services Ready). The
// command writes a new generation of the Service whose env has the value and whose image is
// the same digest; rollback then brings back the previous env, again with the same digest.
func TestServeConfigSetNewRevision(t *testing.T) {
	c := startCluster(t)
	ctx, cs, ns := c.ctx, c.cs, c.ns
	dir := t.TempDir()
	key := sshKey(t, dir, "bob")
	s := c.serve(t, filepath.Join(dir, "data"), key)
	env := gitEnv(key)

	work := workTree(t, env, "goweb")
	git(t, env, work, "remote", "add", "knative", s.remote("goweb"))
	if out, code := push(t, env, work, "knative", "main"); code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, out)
	}
	service := func() (gen int64, image string, env []corev1.EnvVar, release string) {
		t.Helper()
		svc, err := cs.ServingV1().Services(ns).Get(ctx, "goweb", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := svc.Spec.Template.Spec.Containers[0]
		return svc.Generation, c.Image, c.Env, svc.Spec.Template.Annotations["kpush.dev/release"]
	}
	gen1, image1, env1, rel1 := service()
	if len(env1) != 0 || rel1 != "v1" {
		t.Errorf("after the push: env %v, release annotation %q; want no env, v1", env1, rel1)
	}

	mustContain(t, kpushOK(t, s, "config:set", "goweb", "GREETING=hola"), "Released goweb v2")
	gen2, image2, env2, rel2 := service()
	if gen2 <= gen1 {
		t.Errorf("generation %d after config:set, want > %d (a new Revision)", gen2, gen1)
	}
	if image2 != image1 {
		t.Errorf("image after config:set = %s, want the same digest %s", image2, image1)
	}
	if len(env2) != 1 || env2[0].Name != "GREETING" || env2[0].Value != "hola" || rel2 != "v2" {
		t.Errorf("after config:set: env %v, release %q; want GREETING=hola, v2", env2, rel2)
	}

	kpushOK(t, s, "rollback", "goweb", "v1")
	gen3, image3, env3, rel3 := service()
	if gen3 <= gen2 || image3 != image1 || len(env3) != 0 || rel3 != "v3" {
		t.Errorf("after rollback v1: generation %d, image %s, env %v, release %q; want > %d, %s, no env, v3",
			gen3, image3, env3, rel3, gen2, image1)
	}
}
