package knative_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"kpush.dev/kpush/deployer/knative"
)

// TestReleaseMutation checks that a release sets exactly the fields it owns and keeps the rest.
func TestReleaseMutation(t *testing.T) {
	latest, pct := true, int64(100)
	for _, tc := range []struct {
		name     string
		env      map[string]string
		in, want func() *servingv1.Service
	}{{
		name: "empty Service gets one container",
		env:  map[string]string{"B": "2", "A": "1"},
		in:   func() *servingv1.Service { return &servingv1.Service{} },
		want: func() *servingv1.Service {
			s := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: ann()}}
			s.Spec.Template.Annotations = ann()
			s.Spec.Template.Spec.Containers = []corev1.Container{{Image: digestB, Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}}}}
			return s
		},
	}, {
		name: "others' fields kept, owned fields replaced",
		env:  nil,
		in: func() *servingv1.Service {
			s := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{
				Labels:      map[string]string{"team": "payments"},
				Annotations: map[string]string{"note": "x", knative.AnnotationCommit: commitA},
			}}
			s.Spec.Traffic = []servingv1.TrafficTarget{{Tag: "current", LatestRevision: &latest, Percent: &pct}}
			s.Spec.Template.Annotations = map[string]string{"autoscaling.knative.dev/max-scale": "3"}
			s.Spec.Template.Spec.Containers = []corev1.Container{
				{Name: "app", Image: digestA, Env: []corev1.EnvVar{{Name: "OLD", Value: "gone"}},
					EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}}}},
				{Name: "sidecar", Image: "sidecar@sha256:" + digestA[len(digestA)-64:]},
			}
			return s
		},
		want: func() *servingv1.Service {
			a := ann()
			a["note"] = "x"
			s := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "payments"}, Annotations: a}}
			s.Spec.Traffic = []servingv1.TrafficTarget{{Tag: "current", LatestRevision: &latest, Percent: &pct}}
			ta := ann()
			ta["autoscaling.knative.dev/max-scale"] = "3"
			s.Spec.Template.Annotations = ta
			s.Spec.Template.Spec.Containers = []corev1.Container{
				{Name: "app", Image: digestB,
					EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}}}},
				{Name: "sidecar", Image: "sidecar@sha256:" + digestA[len(digestA)-64:]},
			}
			return s
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := release(digestB, commitB)
			r.Env = tc.env
			got := tc.in()
			if err := knative.ReleaseMutation(r)(got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want(), got); diff != "" {
				t.Errorf("mutated Service (-want +got):\n%s", diff)
			}
			again := got.DeepCopy()
			_ = knative.ReleaseMutation(r)(again)
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("not idempotent (-first +second):\n%s", diff)
			}
		})
	}
}

func ann() map[string]string {
	return map[string]string{knative.AnnotationApp: "demo", knative.AnnotationCommit: commitB, knative.AnnotationPusher: "alice"}
}
