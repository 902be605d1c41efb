package buildpacktest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/internal/tools"
)

// TestPodRunnerReadOnlyRootFilesystem checks that PodRunner honours what BuildPod sets, so
// that buildpack's TestPodPlanRunsLocally proves the lifecycle runs with it: a readOnlyRootFilesystem
// container cannot write its root or /tmp unless a volume is mounted there; without it /tmp
// is writable; privileges it would not grant are refused, not ignored.
func TestPodRunnerReadOnlyRootFilesystem(t *testing.T) {
	if _, err := tools.Path("bwrap"); err != nil {
		t.Fatalf("tool bwrap missing (run make tools): %v", err)
	}
	const sh = "local/sh"
	probe := `echo "root=$(awk '$5 == "/" {split($6, o, ","); print o[1]}' /proc/self/mountinfo)"
if (: >/tmp/x) 2>/dev/null; then echo tmp=writable; else echo tmp=not-writable; fi
if (: >/x) 2>/dev/null; then echo rootdir=writable; else echo rootdir=not-writable; fi`
	container := func(name string, ro bool, mounts ...corev1.VolumeMount) corev1.Container {
		return corev1.Container{Name: name, Image: sh, Command: []string{"/bin/sh", "-c", probe}, VolumeMounts: mounts,
			SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr(ro), AllowPrivilegeEscalation: ptr(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ro-probe"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr(int64(buildpack.CNBUserID)), RunAsGroup: ptr(int64(buildpack.CNBGroupID)),
				FSGroup: ptr(int64(buildpack.CNBGroupID)), RunAsNonRoot: ptr(true)},
			InitContainers: []corev1.Container{
				container("ro", true),
				container("ro-tmp", true, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}),
			},
			Containers: []corev1.Container{container("rw", false)},
			Volumes:    []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	runner := &PodRunner{Images: map[string]LocalImage{sh: {}}}
	outs := map[string]*bytes.Buffer{}
	err := runner.Run(context.Background(), pod, ContainerEvents{Output: func(c string) io.Writer {
		outs[c] = &bytes.Buffer{}
		return outs[c]
	}})
	if err != nil {
		t.Fatalf("run: %v\n%v", err, outs)
	}
	for c, want := range map[string]string{
		"ro":     "root=ro\ntmp=not-writable\nrootdir=not-writable\n",
		"ro-tmp": "root=ro\ntmp=writable\nrootdir=not-writable\n",
		"rw":     "tmp=writable\nrootdir=not-writable\n", // the root mount is bubblewrap's: not the image's, not writable by the uid
	} {
		got := ""
		if outs[c] != nil {
			got = outs[c].String()
		}
		if !strings.HasSuffix(got, want) || c != "rw" && !strings.HasPrefix(got, want) {
			t.Errorf("container %s printed %q, want %q", c, got, want)
		}
	}

	for name, sc := range map[string]*corev1.SecurityContext{
		"privileged":               {Privileged: ptr(true)},
		"allowPrivilegeEscalation": {AllowPrivilegeEscalation: ptr(true)},
		"capabilities add":         {Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}},
		"other user":               {RunAsUser: ptr(int64(0))},
	} {
		bad := pod.DeepCopy()
		bad.Spec.Containers[0].SecurityContext = sc
		bad.Spec.InitContainers = nil
		if err := runner.Run(context.Background(), bad, ContainerEvents{}); err == nil {
			t.Errorf("%s: the runner ran a container it cannot run as asked", name)
		}
	}
}

func ptr[T any](v T) *T { return &v }
