package test

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

// TestServeTwoReplicasConcurrency: two
// `kpush serve` processes share one data dir and one envtest kube-apiserver (the app lease is
// a coordination.k8s.io Lease there; knativetest.StandIn marks Services Ready), and pushes and
// commands are split between them.
//
//  1. config:set on replica 2 while a push built by replica 1 waits at the gate: config:set
//     does not wait for the build, and the final Service has both the new env and the
//     push's image.
//  2. A slow push of A (replica 2) started before a fast push of B (replica 1): B queues
//     behind A across processes, A is superseded when its build ends, and A's image never
//     appears in the Service (watched from the start).
//  3. Four simultaneous pushes split between the replicas: honest exit statuses, the Service
//     on the last release's digest, every commit kept by a release ref, git fsck clean.
func TestServeTwoReplicasConcurrency(t *testing.T) {
	c := startCluster(t)
	ctx, cs, ns := c.ctx, c.cs, c.ns

	// Every image the Service ever carries, from a watch started before any push.
	var (
		imagesMu sync.Mutex
		images   = map[string]bool{}
	)
	w, err := cs.ServingV1().Services(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=static"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			if svc, ok := ev.Object.(*servingv1.Service); ok && ev.Type != watch.Deleted && len(svc.Spec.Template.Spec.Containers) > 0 {
				imagesMu.Lock()
				images[svc.Spec.Template.Spec.Containers[0].Image] = true
				imagesMu.Unlock()
			}
		}
	}()

	g := newGate(t)
	dir := t.TempDir()
	key := sshKey(t, dir, "bob")
	data := filepath.Join(dir, "data")
	replica := func() *server {
		return c.serve(t, data, key, "--lease-ttl", "10s", "--buildpack", filepath.Join("testdata", "buildpacks", "gate"))
	}
	s1 := replica()
	s2 := replica() // after s1: the first one creates the host key
	env := gitEnv(key)

	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "r1", s1.remote("static"))
	git(t, env, work, "remote", "add", "r2", s2.remote("static"))
	if out, code := push(t, env, work, "r1", "main"); code != 0 {
		t.Fatalf("first push exited %d:\n%s", code, out)
	}
	service := func() (image string, env map[string]string) {
		t.Helper()
		svc, err := cs.ServingV1().Services(ns).Get(ctx, "static", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := svc.Spec.Template.Spec.Containers[0]
		env = map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		return c.Image, env
	}
	releases := func() map[int]release {
		t.Helper()
		var rels []release
		kpushJSON(t, s2, &rels, "releases", "static", "--json")
		out := map[int]release{}
		for _, r := range rels {
			out[r.Version] = r
		}
		return out
	}

	t.Run("config:set during a build", func(t *testing.T) {
		c := page(t, env, work, "C", g)
		res := pushBg(env, work, "C", "r1", "main") // v2
		g.waitStarted(t, "C")
		done := make(chan sshResult, 1)
		go func() { done <- sshCmd(t, s2, key, "", "config:set", "static", "GREETING=hola") }() // v3
		select {
		case r := <-done:
			if r.code != 0 || !strings.Contains(r.stdout, "Released static v3") {
				t.Fatalf("config:set during the build: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
		case <-time.After(time.Minute):
			t.Fatal("config:set waited for the running build")
		}
		g.open("C")
		r := <-res
		if checkHonest(t, r) != 2 {
			t.Fatalf("push of C was not released as v2:\n%s", r.out)
		}
		image, senv := service()
		rels := releases()
		if image != rels[2].Image || senv["GREETING"] != "hola" {
			t.Errorf("Service: image %s, env %v; want v2's %s and GREETING=hola", image, senv, rels[2].Image)
		}
		if rels[2].Commit != c || rels[2].Base != 3 || rels[2].Env["GREETING"] != "hola" {
			t.Errorf("v2 = %+v; want commit %s planned on the config release v3, with its env", rels[2], c)
		}
	})

	t.Run("slow build never deploys over a newer push", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "other")
		git(t, env, "", "clone", "-q", s1.remote("static"), other)
		a := page(t, env, work, "A", g)
		b := page(t, env, other, "B", nil)
		resA := pushBg(env, work, "A", "r2", "main") // v4, built by replica 2
		g.waitStarted(t, "A")
		resB := pushBg(env, other, "B", "origin", "main") // v5, through replica 1
		waitQueued(t, s1, "static", b)
		g.open("A")
		ra, rb := <-resA, <-resB
		checkHonest(t, ra)
		checkHonest(t, rb)
		if ra.code == 0 || !strings.Contains(ra.out, "v4 not deployed: superseded by v5 ("+b[:7]+" by bob)") {
			t.Errorf("slow push of A: exit %d, want superseded by v5:\n%s", ra.code, ra.out)
		}
		if rb.code != 0 || !strings.Contains(rb.out, "v5 queued behind build #3 by bob, "+a[:7]) {
			t.Errorf("fast push of B: exit %d, want queued behind A's build and released:\n%s", rb.code, rb.out)
		}
		rels := releases()
		image, senv := service()
		if image != rels[5].Image || senv["GREETING"] != "hola" {
			t.Errorf("Service: image %s env %v; want B's %s with GREETING=hola", image, senv, rels[5].Image)
		}
		imagesMu.Lock()
		defer imagesMu.Unlock()
		// A's build is cancelled as soon as replica 2 sees B queued (it would not be deployed);
		// the gate opens at about that time, so A may also finish and be refused at deploy.
		if (rels[4].Status != "cancelled" && rels[4].Status != "failed") || (rels[4].Image != "" && images[rels[4].Image]) {
			t.Errorf("A (v4) = %s with image %q; want cancelled or not deployed, never in the Service (images seen: %v)", rels[4].Status, rels[4].Image, images)
		}
		git(t, env, work, "fetch", "-q", "r1")
		git(t, env, work, "reset", "-q", "--hard", "r1/main") // on B, for the next step
	})

	t.Run("simultaneous pushes split between replicas", func(t *testing.T) {
		base := git(t, env, work, "rev-parse", "HEAD")
		var (
			chans   []<-chan pushResult
			commits = map[string]string{}
			dirs    []string
		)
		for i := range 4 {
			name := fmt.Sprintf("p%d", i)
			d := filepath.Join(t.TempDir(), name)
			git(t, env, "", "clone", "-q", s1.remote("static"), d)
			if got := git(t, env, d, "rev-parse", "HEAD"); got != base {
				t.Fatalf("clone at %s, want %s", got, base)
			}
			commits[name] = page(t, env, d, name, nil)
			dirs = append(dirs, d)
		}
		for i, d := range dirs {
			remote := []string{s1.remote("static"), s2.remote("static")}[i%2]
			chans = append(chans, pushBg(env, d, filepath.Base(d), remote, "main"))
		}
		last := 0
		for _, ch := range chans {
			last = max(last, checkHonest(t, <-ch))
		}
		if last == 0 {
			t.Fatal("none of the simultaneous pushes was released")
		}
		rels := releases()
		image, _ := service()
		if image != rels[last].Image {
			t.Errorf("Service image %s, want the last release's (v%d) %s", image, last, rels[last].Image)
		}
		for v, r := range rels {
			if r.Status == "pending" || (r.Status == "succeeded" && v > last) {
				t.Errorf("v%d is %s after every push returned (last released v%d)", v, r.Status, last)
			}
		}
		var want []string
		for _, c := range commits {
			want = append(want, c)
		}
		checkRepo(t, data, "static", want)
	})
}
