package knative_test

import (
	"bytes"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"kpush.dev/kpush/deployer/knative"
)

// TestDestroy deletes a kpush Service (annotated with its release), tolerates a missing one
// and refuses a Service kpush did not create.
func TestDestroy(t *testing.T) {
	f := newFixture(t, true)
	d := f.deployer()
	r := release(digestA, commitA)
	r.Version = 7
	if _, err := d.Deploy(f.ctx, r, &bytes.Buffer{}); err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	svc := f.get(t, "demo")
	if got := svc.Annotations[knative.AnnotationRelease]; got != "v7" {
		t.Errorf("Service annotation %s = %q, want v7", knative.AnnotationRelease, got)
	}
	if got := svc.Spec.Template.Annotations[knative.AnnotationRelease]; got != "v7" {
		t.Errorf("template annotation %s = %q, want v7", knative.AnnotationRelease, got)
	}

	if err := d.Destroy(f.ctx, "demo"); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := f.cs.ServingV1().Services(f.ns).Get(f.ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after Destroy, Get = %v, want NotFound", err)
	}
	if err := d.Destroy(f.ctx, "demo"); err != nil {
		t.Errorf("Destroy of a missing Service: %v, want nil", err)
	}

	foreign := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.ns}}
	foreign.Spec.Template.Spec.Containers = []corev1.Container{{Image: digestB}}
	if _, err := f.cs.ServingV1().Services(f.ns).Create(f.ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(f.ctx, "other"); !errors.Is(err, knative.ErrNotManaged) {
		t.Errorf("Destroy of a foreign Service = %v, want ErrNotManaged", err)
	}
	f.get(t, "other") // still there
}
