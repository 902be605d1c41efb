package knativetest_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/deployer/knativetest"
)

// TestStandIn starts a real API server, reaches it through a written kubeconfig file (as
// another process would), and checks that the stand-in controller reports Ready=True, then
// Ready=False once told to, for the newest generation.
func TestStandIn(t *testing.T) {
	cfg := knativetest.Start(t)
	ns := knativetest.Namespace(t, cfg)

	path := knativetest.WriteKubeconfig(t, cfg, ns)
	kcfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("loading kubeconfig %s: %v", path, err)
	}
	cs := servingclientset.NewForConfigOrDie(kcfg)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	si := knativetest.StartStandIn(ctx, t, cs, ns)

	svc := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
	svc.Spec.Template.Spec.Containers = []corev1.Container{{Image: "registry.example/demo@sha256:" + sha('a')}}
	svc, err = cs.ServingV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service: %v", err)
	}
	got := waitFor(t, ctx, cs, ns, "demo", func(s *servingv1.Service) bool { return s.IsReady() })
	if want := "http://demo." + ns + ".example.com"; got.Status.URL.String() != want {
		t.Errorf("status.url = %q, want %q", got.Status.URL, want)
	}
	if got.Status.LatestReadyRevisionName != "demo-00001" || got.Status.LatestCreatedRevisionName != "demo-00001" {
		t.Errorf("revisions = created %q ready %q, want demo-00001 for both",
			got.Status.LatestCreatedRevisionName, got.Status.LatestReadyRevisionName)
	}
	for _, ct := range []apis.ConditionType{servingv1.ServiceConditionConfigurationsReady, servingv1.ServiceConditionRoutesReady} {
		if c := got.Status.GetCondition(ct); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("condition %s = %+v, want True", ct, c)
		}
	}

	si.Set("demo", knativetest.Outcome{Status: corev1.ConditionFalse, Reason: "RevisionFailed", Message: "boom"})
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error { // the stand-in writes status concurrently
		s, err := cs.ServingV1().Services(ns).Get(ctx, "demo", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Template.Spec.Containers[0].Image = "registry.example/demo@sha256:" + sha('b')
		_, err = cs.ServingV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating Service: %v", err)
	}
	got = waitFor(t, ctx, cs, ns, "demo", func(s *servingv1.Service) bool {
		return s.Status.ObservedGeneration == 2 && s.IsFailed()
	})
	c := got.Status.GetCondition(apis.ConditionReady)
	if c.Reason != "RevisionFailed" || c.Message != "boom" {
		t.Errorf("Ready condition = %+v, want reason RevisionFailed, message boom", c)
	}
	if got.Status.LatestReadyRevisionName != "demo-00001" || got.Status.LatestCreatedRevisionName != "demo-00002" {
		t.Errorf("revisions = created %q ready %q, want demo-00002 and demo-00001",
			got.Status.LatestCreatedRevisionName, got.Status.LatestReadyRevisionName)
	}
}

func waitFor(t *testing.T, ctx context.Context, cs servingclientset.Interface, ns, name string, ok func(*servingv1.Service) bool) *servingv1.Service {
	t.Helper()
	for {
		s, err := cs.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading Service %s: %v", name, err)
		}
		if ok(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Service %s never reached the wanted state; last status %+v", name, s.Status)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func sha(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
