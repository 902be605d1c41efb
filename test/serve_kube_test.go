package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kpush.dev/kpush/buildpack"
)

// TestServeBuildPod: `kpush serve --builder kube` builds a push in a build Pod. There is no
// kubelet, so the Pod never runs: the test checks the Pod kpush creates, then does what its
// source container would do — `kpush source fetch` with the Pod's single-use token from the
// URL the Pod was given — and gets the pushed tree; then builds:cancel ends the push, which
// fails, and the Pod is deleted.
func TestServeBuildPod(t *testing.T) {
	c := startCluster(t)
	dir := t.TempDir()
	key := sshKey(t, dir, "alice")
	sourceAddr := freeAddr(t)
	sourceURL := "http://" + sourceAddr + "/source"
	const kpushImage = "registry.example.com/kpush@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	s := c.serve(t, filepath.Join(dir, "data"), key, "--builder", "kube",
		"--kpush-image", kpushImage, "--source-addr", sourceAddr, "--source-url", sourceURL,
		"--builder-resources", `{"requests":{"cpu":"250m"}}`)

	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kcs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env := gitEnv(key)
	work := workTree(t, env, "static")
	git(t, env, work, "remote", "add", "knative", s.remote("static"))
	pushed := pushBg(env, work, "static", "knative", "main")

	var pod *corev1.Pod
	for deadline := time.Now().Add(2 * time.Minute); pod == nil; time.Sleep(100 * time.Millisecond) {
		pods, err := kcs.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{LabelSelector: buildpack.LabelApp + "=static"})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) > 0 {
			pod = &pods.Items[0]
		}
		select {
		case r := <-pushed:
			t.Fatalf("the push ended before a build Pod appeared (exit %d):\n%s", r.code, r.out)
		default:
		}
		if pod == nil && time.Now().After(deadline) {
			t.Fatal("no build Pod within 2m of the push")
		}
	}
	var names []string
	for _, ct := range pod.Spec.InitContainers {
		names = append(names, ct.Name)
	}
	want := []string{buildpack.ContainerSource, buildpack.ContainerAnalyze, buildpack.ContainerDetect,
		buildpack.ContainerRestore, buildpack.ContainerBuild, buildpack.ContainerExport}
	if !slices.Equal(names, want) || len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != buildpack.ContainerComplete {
		t.Errorf("build Pod containers: init %v, main %d; want init %v and main %q", names, len(pod.Spec.Containers), want, buildpack.ContainerComplete)
	}
	src := pod.Spec.InitContainers[0]
	if src.Image != kpushImage || !slices.Contains(src.Args, "--url="+sourceURL) {
		t.Errorf("source container: image %s args %v; want %s with --url=%s", src.Image, src.Args, kpushImage, sourceURL)
	}
	if got := pod.Spec.InitContainers[1].Resources.Requests.Cpu().String(); got != "250m" {
		t.Errorf("analyze container requests cpu %s, want 250m from --builder-resources", got)
	}
	var token string
	for _, e := range src.Env {
		if e.Name == buildpack.SourceTokenEnv {
			token = e.Value
		}
	}

	// What the source container runs, from the kpush binary.
	dest := t.TempDir()
	fetch := exec.Command(kpushBin, "source", "fetch", "--url", sourceURL, "--dest", dest)
	fetch.Env = append(os.Environ(), buildpack.SourceTokenEnv+"="+token)
	if out, err := fetch.CombinedOutput(); err != nil {
		t.Fatalf("kpush source fetch: %v\n%s", err, out)
	}
	wantFile, err := os.ReadFile(filepath.Join(work, "public", "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "public", "index.html")); err != nil || string(got) != string(wantFile) {
		t.Errorf("fetched public/index.html = %q (%v), want the pushed %q", got, err, wantFile)
	}

	kpushOK(t, s, "builds:cancel", "static")
	select {
	case r := <-pushed:
		if r.code == 0 || !strings.Contains(r.out, "cancelled by alice") {
			t.Errorf("the cancelled push exited %d; want non-zero, cancelled by alice:\n%s", r.code, r.out)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the push did not end within 2m of builds:cancel")
	}
	if _, err := kcs.CoreV1().Pods(c.ns).Get(c.ctx, pod.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("build Pod %s still exists after its build was cancelled", pod.Name)
	}
}
