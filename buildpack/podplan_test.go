// Tests that run build Pods on this machine with buildpacktest.PodRunner. They are in
// package buildpack_test because buildpacktest imports buildpack; export_test.go gives them
// what they use of buildpack's unexported code and test helpers.
package buildpack_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/buildpack/buildpacktest"
	"kpush.dev/kpush/deployer/knativetest"
)

const regUser, regPass = "builder", "hunter2-registry-password"

// authRegistry is ggcr's in-process registry behind a basic-auth check on 127.0.0.1: a real
// registry that refuses requests without the right credentials.
func authRegistry(t *testing.T) string {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != regUser || p != regPass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func dockerConfigJSON(reg string) []byte {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{reg: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte(regUser + ":" + regPass))}}})
	return b
}

// credProbe is a buildpack whose build looks for registry credentials everywhere a buildpack
// could: its env, the mount path and $DOCKER_CONFIG, ~/.docker, and every process's environ.
// It also reports its uid, whether its root filesystem is mounted read-only and whether it
// can write /tmp.
func credProbe(t *testing.T) string {
	return buildpack.WriteTree(t, map[string]string{
		"buildpack.toml": "api = \"0.10\"\n[buildpack]\nid = \"test/credprobe\"\nversion = \"0.0.1\"\n[[targets]]\nos = \"linux\"\n",
		"bin/detect":     "#!/bin/sh\nexit 0\n",
		"bin/build": `#!/bin/sh
found=
[ -n "${DOCKER_CONFIG:-}" ] && found="$found env-DOCKER_CONFIG"
[ -n "${CNB_REGISTRY_AUTH:-}" ] && found="$found env-CNB_REGISTRY_AUTH"
for f in ` + buildpack.RegistryAuthPath + `/config.json "${DOCKER_CONFIG:-/nonexistent}/config.json" "$HOME/.docker/config.json"; do
	if cat "$f" >/dev/null 2>&1; then found="$found file-$f"; fi
done
if cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -q -e '^DOCKER_CONFIG=' -e '^CNB_REGISTRY_AUTH='; then found="$found proc-environ"; fi
echo "probe uid: $(id -u):$(id -g)"
echo "probe root: $(awk '$5 == "/" {split($6, o, ","); print o[1]}' /proc/self/mountinfo)"
if (: >/tmp/probe) 2>/dev/null; then echo "probe tmp: writable"; else echo "probe tmp: not writable"; fi
if [ -n "$found" ]; then echo "probe credentials: readable:$found"; else echo "probe credentials: hidden"; fi
`,
	})
}

// localImages returns the stand-ins for the builder and kpush images: the builder's /cnb is
// laid out as buildpack.Local lays it out (kpush's buildpacks plus extra), the kpush image is the real
// kpush binary as ko places it.
func localImages(t *testing.T, reg string, extra []string, order []buildpack.Group) map[string]buildpacktest.LocalImage {
	t.Helper()
	buildpack.RequireTools(t, "bwrap", "lifecycle", "launcher", "busybox")
	runImage, err := buildpack.EnsureRunImage(context.Background(), reg+"/kpush/kpush.run",
		buildpack.WithRemoteOptions(remote.WithAuth(&authn.Basic{Username: regUser, Password: regPass})))
	if err != nil {
		t.Fatal(err)
	}
	goRoot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	var bps []fs.FS
	for _, d := range extra {
		bps = append(bps, os.DirFS(d))
	}
	builder, err := buildpacktest.LocalBuilderImage(t.TempDir(), bps, order, runImage, strings.TrimSpace(string(goRoot)))
	if err != nil {
		t.Fatal(err)
	}
	kpushImage := buildpacktest.LocalImage{Entrypoint: []string{"/ko-app/kpush"}, Files: map[string]string{"/ko-app/kpush": buildpack.KpushForPods(t)}}
	if exe, err := os.Executable(); err == nil && kpushImage.Files["/ko-app/kpush"] == exe {
		// This test binary stands in for kpush. A package it links (envtest's port cache)
		// creates $XDG_CACHE_HOME/kubebuilder-envtest at init, else panics; on the source
		// and complete containers' read-only root there is no writable place, so the
		// directory is there already.
		cache := t.TempDir()
		if err := os.Mkdir(filepath.Join(cache, "kubebuilder-envtest"), 0o755); err != nil {
			t.Fatal(err)
		}
		kpushImage.Files["/ko-app/cache"] = cache
		kpushImage.Env = []string{"XDG_CACHE_HOME=/ko-app/cache"}
	}
	return map[string]buildpacktest.LocalImage{buildpack.TestBuilderImage: builder, buildpack.TestKpushImage: kpushImage}
}

// TestPodPlanRunsLocally runs a build Pod's plan with buildpacktest.PodRunner: a control run
// with the credentials also mounted into the build phase (the probe must see them, or the
// probe could not fail), then the pod as built (probe sees nothing, image published with
// credentials the registry demands), then the same pod again (its source token is spent:
// refused).
func TestPodPlanRunsLocally(t *testing.T) {
	reg := authRegistry(t)
	images := localImages(t, reg, []string{credProbe(t)}, []buildpack.Group{{{ID: buildpack.ProcfileID}, {ID: "test/credprobe"}}})
	sources := &buildpack.SourceServer{}
	srv := httptest.NewServer(sources)
	defer srv.Close()
	runner := &buildpacktest.PodRunner{Images: images, Secrets: map[string]map[string][]byte{
		"regcred": {corev1.DockerConfigJsonKey: dockerConfigJSON(reg)}}}

	build := func(mutate func(*corev1.Pod), token, previous string) (*corev1.Pod, string, map[string]int, error) {
		src := buildpack.WriteTree(t, map[string]string{"Procfile": "web: sleep 1000\n"})
		if token == "" {
			var err error
			if token, err = sources.Register("t", src); err != nil {
				t.Fatal(err)
			}
		}
		pod, err := buildpack.BuildPod(buildpack.PodSpec{Name: "kpush-build-probe", App: "probe", Tag: buildpack.NewTag(time.Now()),
			Image: reg + "/kpush/probe", PreviousImage: previous, KpushImage: buildpack.TestKpushImage, BuilderImage: buildpack.TestBuilderImage,
			SourceURL: srv.URL, SourceToken: token, RegistrySecret: "regcred", Deadline: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if mutate != nil {
			mutate(pod)
		}
		var mu sync.Mutex
		var out bytes.Buffer
		codes := map[string]int{}
		err = runner.Run(context.Background(), pod, buildpacktest.ContainerEvents{
			Output:   func(string) io.Writer { return &lockedWriter{mu: &mu, w: &out} },
			Finished: func(c string, code int) { codes[c] = code },
		})
		return pod, out.String(), codes, err
	}

	// Control: give the build phase the credentials too; the probe must find them.
	control, out, _, err := build(func(p *corev1.Pod) {
		for i := range p.Spec.InitContainers {
			if c := &p.Spec.InitContainers[i]; c.Name == buildpack.ContainerBuild {
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: buildpack.VolAuth, MountPath: buildpack.RegistryAuthPath, ReadOnly: true})
				c.Env = append(c.Env, corev1.EnvVar{Name: "DOCKER_CONFIG", Value: buildpack.RegistryAuthPath})
			}
		}
	}, "", "")
	if err != nil {
		t.Fatalf("control build: %v\n%s", err, out)
	}
	if !strings.Contains(out, "probe credentials: readable:") || !strings.Contains(out, "file-"+buildpack.RegistryAuthPath+"/config.json") ||
		!strings.Contains(out, "proc-environ") {
		t.Fatalf("control: the probe did not find credentials mounted into the build phase:\n%s", out)
	}

	auth := remote.WithAuth(&authn.Basic{Username: regUser, Password: regPass})
	controlRef, err := name.ParseReference(control.Annotations["kpush.dev/image"])
	if err != nil {
		t.Fatal(err)
	}
	controlDesc, err := remote.Head(controlRef, auth)
	if err != nil {
		t.Fatalf("the control build's tag %s does not resolve: %v", controlRef, err)
	}
	previous := controlRef.Context().Digest(controlDesc.Digest.String()).String()

	// As built, with the control build as the previous image: the probe finds nothing; the
	// image is in the registry; the analyzer found the previous image (with the credentials
	// only it, restore and export have) and the exporter reused its layers.
	pod, out, codes, err := build(nil, "", previous)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, want := range []string{"probe credentials: hidden", fmt.Sprintf("probe uid: %d:%d", buildpack.CNBUserID, buildpack.CNBGroupID),
		"probe root: ro\n", "probe tmp: writable",
		"Fetched the pushed source", "build complete", "Reusing layers from image '" + previous + "'", "Reusing layer 'buildpacksio/lifecycle:launcher'"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Image with name") { // `Image with name "..." not found`
		t.Errorf("build with a previous image: the analyzer did not find it:\n%s", out)
	}
	if strings.Contains(out, regPass) || strings.Contains(out, base64.StdEncoding.EncodeToString([]byte(regUser+":"+regPass))) {
		t.Errorf("output contains the registry password")
	}
	tagRef, err := name.ParseReference(pod.Annotations["kpush.dev/image"])
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(tagRef, auth)
	if err != nil {
		t.Fatalf("the unique tag %s does not resolve: %v", tagRef, err)
	}
	if _, err := remote.Head(tagRef); err == nil {
		t.Errorf("the registry answered without credentials: the auth check is not in force")
	}
	img, err := remote.Image(tagRef.Context().Digest(desc.Digest.String()), auth)
	if err != nil {
		t.Fatal(err)
	}
	if cf, err := img.ConfigFile(); err != nil || cf.Config.Labels["io.buildpacks.build.metadata"] == "" {
		t.Errorf("image config lacks CNB metadata: %v", err)
	}
	if _, err := remote.Head(tagRef.Context().Tag("cache"), auth); err != nil {
		t.Errorf("no cache image %s:cache: %v", tagRef.Context(), err)
	}
	for _, c := range []string{buildpack.ContainerSource, buildpack.ContainerAnalyze, buildpack.ContainerDetect, buildpack.ContainerRestore, buildpack.ContainerBuild, buildpack.ContainerExport, buildpack.ContainerComplete} {
		if code, ok := codes[c]; !ok || code != 0 {
			t.Errorf("container %s: exit %d (ran %v)", c, code, ok)
		}
	}

	// The same Pod again: its token is spent, the source container fails, nothing else runs.
	_, out, codes, err = runPodAgain(runner, pod)
	if err == nil || codes[buildpack.ContainerSource] == 0 || !strings.Contains(out, "already used") {
		t.Errorf("reused token: err %v, codes %v, output:\n%s", err, codes, out)
	}
	if _, ran := codes[buildpack.ContainerAnalyze]; ran {
		t.Errorf("analyze ran after the source fetch failed")
	}
	// A wrong token.
	_, out, codes, err = build(nil, "not-the-token", "")
	if err == nil || codes[buildpack.ContainerSource] == 0 || !strings.Contains(out, "not valid") {
		t.Errorf("wrong token: err %v, codes %v, output:\n%s", err, codes, out)
	}
}

func runPodAgain(r *buildpacktest.PodRunner, pod *corev1.Pod) (*corev1.Pod, string, map[string]int, error) {
	var out bytes.Buffer
	var mu sync.Mutex
	codes := map[string]int{}
	err := r.Run(context.Background(), pod, buildpacktest.ContainerEvents{
		Output:   func(string) io.Writer { return &lockedWriter{mu: &mu, w: &out} },
		Finished: func(c string, code int) { codes[c] = code },
	})
	return pod, out.String(), codes, err
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestKubeBuild is the cluster runner against a real kube-apiserver (envtest). There is no
// kubelet, so the test stands in for one (standInKubelet): it watches Pods, runs each with
// buildpacktest.PodRunner (the real lifecycle, the real `kpush source fetch`), writes
// container statuses through the pods/status subresource and serves their logs. Kube creates
// the Pod (the apiserver validates it), follows the logs live, resolves the digest from the
// unique tag in a registry that demands credentials, and deletes the Pod. The namespace
// enforces the "restricted" Pod Security Standard, so the apiserver's own PodSecurity
// admission checks the build Pod's isolation settings (a control Pod that breaks them is
// refused).
func TestKubeBuild(t *testing.T) {
	cfg := knativetest.Start(t)
	ns := knativetest.Namespace(t, cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := authRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	enforceRestricted(ctx, t, cs, ns)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: dockerConfigJSON(reg)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	images := localImages(t, reg, []string{credProbe(t)}, []buildpack.Group{{{ID: buildpack.GoID}, {ID: "test/credprobe"}}})
	kubelet := startStandInKubelet(ctx, t, cs, ns, &buildpacktest.PodRunner{Images: images})

	sources := &buildpack.SourceServer{}
	srv := httptest.NewServer(sources)
	defer srv.Close()
	k := &buildpack.Kube{
		Client: cs, Namespace: ns, Sources: sources, SourceURL: srv.URL,
		KpushImage: buildpack.TestKpushImage, BuilderImage: buildpack.TestBuilderImage, RegistrySecret: "regcred",
		Deadline: 5 * time.Minute,
		Keychain: staticKeychain{authn.FromConfig(authn.AuthConfig{Username: regUser, Password: regPass})},
		Logs:     kubelet.logs,
	}
	var out bytes.Buffer
	res, err := k.Build(ctx, buildpack.Request{App: "goapp", SourceDir: buildpack.GoApp(t), Image: reg + "/kpush/goapp"}, &out)
	if testing.Verbose() {
		t.Logf("build output:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	ref, err := name.NewDigest(res.Image)
	if err != nil || ref.Context().String() != reg+"/kpush/goapp" {
		t.Fatalf("result %q is not %s/kpush/goapp@sha256:...: %v", res.Image, reg, err)
	}
	if _, err := remote.Head(ref, remote.WithAuth(&authn.Basic{Username: regUser, Password: regPass})); err != nil {
		t.Errorf("result digest does not resolve: %v", err)
	}
	text := out.String()
	for _, want := range []string{"-----> Fetching source", "-----> Analyzing", "-----> Detecting", "-----> Building",
		"Building example.com/goapp", "probe credentials: hidden", "-----> Exporting", "Saving " + reg + "/kpush/goapp:",
		"-----> Analyzing\n" + buildpack.MsgFirstBuild + "\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(text, "Image with name") { // `Image with name "<fresh tag>" not found`
		t.Errorf("first build output has the analyzer's \"not found\" line:\n%s", text)
	}
	if !kubelet.sawPod() {
		t.Fatalf("the stand-in kubelet never saw the build pod")
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: buildpack.LabelManagedBy + "=kpush"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("build pod %s not deleted", pods.Items[0].Name)
	}
	buildpack.CheckBuildPod(t, kubelet.firstPod())

	// A build that fails detection: ErrDetect from the detect container's exit code 20, Pod gone.
	out.Reset()
	_, err = k.Build(ctx, buildpack.Request{App: "empty", SourceDir: buildpack.WriteTree(t, map[string]string{"README": "x"}), Image: reg + "/kpush/empty"}, &out)
	var be *buildpack.Error
	if !errors.Is(err, buildpack.ErrDetect) || !errors.As(err, &be) || be.ExitCode != 20 {
		t.Errorf("nothing detectable: err %v, want ErrDetect with exit 20\n%s", err, out.String())
	}
	if pods, _ := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("failed build's pod not deleted")
	}
}

// enforceRestricted labels namespace ns to enforce the restricted Pod Security Standard and
// checks that the apiserver does: a build Pod that may escalate privileges is refused.
func enforceRestricted(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted","pod-security.kubernetes.io/enforce-version":"latest"}}}`
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	bad, err := buildpack.BuildPod(buildpack.PodSpec{Name: "kpush-build-control", App: "control", Tag: "t", Image: "reg.example.com/kpush/control",
		KpushImage: buildpack.TestKpushImage, BuilderImage: buildpack.TestBuilderImage, SourceURL: "http://kpush/source", SourceToken: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	bad.Spec.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = buildpack.Ptr(true)
	_, err = cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Fatalf("a build Pod with allowPrivilegeEscalation in a restricted namespace: err %v, want PodSecurity's refusal", err)
	}
}

// staticKeychain answers every registry with one authenticator.
type staticKeychain struct{ a authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.a, nil }

// standInKubelet plays the kubelet for an apiserver without nodes: it runs Pods with
// buildpacktest.PodRunner, reports container states through pods/status and keeps their
// logs. It is a stand-in for what envtest cannot provide (no kubelet), not a fake of kpush's
// code.
type standInKubelet struct {
	t      *testing.T
	cs     kubernetes.Interface
	ns     string
	runner *buildpacktest.PodRunner

	mu   sync.Mutex
	bufs map[string]*followBuf // "pod/container"
	seen []*corev1.Pod
}

func startStandInKubelet(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string, r *buildpacktest.PodRunner) *standInKubelet {
	k := &standInKubelet{t: t, cs: cs, ns: ns, runner: r, bufs: map[string]*followBuf{}}
	_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: standInNode}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	cancels := map[string]context.CancelFunc{}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added:
				pctx, cancel := context.WithCancel(ctx)
				cancels[p.Name] = cancel
				wg.Add(1)
				go func() { defer wg.Done(); k.runPod(pctx, p) }()
			case watch.Deleted:
				if c := cancels[p.Name]; c != nil {
					c()
				}
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); wg.Wait() })
	return k
}

func (k *standInKubelet) buf(pod, c string) *followBuf {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.bufs[pod+"/"+c]
	if b == nil {
		b = newFollowBuf()
		k.bufs[pod+"/"+c] = b
	}
	return b
}

func (k *standInKubelet) sawPod() bool { k.mu.Lock(); defer k.mu.Unlock(); return len(k.seen) > 0 }
func (k *standInKubelet) firstPod() *corev1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.seen[0]
}

func (k *standInKubelet) logs(ctx context.Context, ns, pod, c string) (io.ReadCloser, error) {
	return k.buf(pod, c).reader(ctx), nil
}

func (k *standInKubelet) runPod(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	k.seen = append(k.seen, pod.DeepCopy())
	k.mu.Unlock()
	r := *k.runner
	r.Secrets = map[string]map[string][]byte{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			s, err := k.cs.CoreV1().Secrets(k.ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				k.t.Errorf("stand-in kubelet: reading secret %s: %v", v.Secret.SecretName, err)
				return
			}
			r.Secrets[s.Name] = s.Data
		}
	}
	// Schedule it (the scheduler's job): the apiserver keeps container statuses only for
	// Pods bound to a node.
	if err := k.cs.CoreV1().Pods(k.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: standInNode}}, metav1.CreateOptions{}); err != nil {
		k.t.Errorf("stand-in kubelet: binding %s: %v", pod.Name, err)
		return
	}
	now := metav1.Now()
	set := func(c string, st corev1.ContainerState, phase corev1.PodPhase) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := k.cs.CoreV1().Pods(k.ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(p.Status.InitContainerStatuses) == 0 {
				for _, ic := range p.Spec.InitContainers {
					p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{Name: ic.Name, Image: ic.Image,
						State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}})
				}
				for _, mc := range p.Spec.Containers {
					p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: mc.Name, Image: mc.Image,
						State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}})
				}
			}
			if s := buildpack.ContainerStatus(p, c); s != nil {
				s.State = st
			}
			if phase != "" {
				p.Status.Phase = phase
			}
			_, err = k.cs.CoreV1().Pods(k.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
			k.t.Errorf("stand-in kubelet: updating status of %s: %v", pod.Name, err)
		}
	}
	err := r.Run(ctx, pod, buildpacktest.ContainerEvents{
		Output: func(c string) io.Writer { return k.buf(pod.Name, c) },
		Started: func(c string) {
			set(c, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}, "")
		},
		Finished: func(c string, code int) {
			k.buf(pod.Name, c).Close()
			phase := corev1.PodPhase("")
			if code != 0 {
				phase = corev1.PodFailed
			}
			set(c, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), StartedAt: now, FinishedAt: metav1.Now()}}, phase)
		},
	})
	if err == nil {
		set(buildpack.ContainerComplete, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: metav1.Now()}}, corev1.PodSucceeded)
	}
	k.mu.Lock()
	for key, b := range k.bufs {
		if strings.HasPrefix(key, pod.Name+"/") {
			b.Close()
		}
	}
	k.mu.Unlock()
}

const standInNode = "kpush-standin-node"

// followBuf is a container log: written by the container, read from the start by any number
// of followers, who block for more until it is closed (the container ended).
type followBuf struct {
	mu     sync.Mutex
	cond   *sync.Cond
	data   []byte
	closed bool
}

func newFollowBuf() *followBuf {
	b := &followBuf{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *followBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.data = append(b.data, p...)
	b.cond.Broadcast()
	return len(p), nil
}

func (b *followBuf) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.cond.Broadcast()
}

type followReader struct {
	b   *followBuf
	off int
}

func (b *followBuf) reader(ctx context.Context) io.ReadCloser {
	context.AfterFunc(ctx, b.Close) // a follower that gives up ends the stream
	return &followReader{b: b}
}

func (r *followReader) Read(p []byte) (int, error) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	for r.off == len(r.b.data) && !r.b.closed {
		r.b.cond.Wait()
	}
	if r.off == len(r.b.data) {
		return 0, io.EOF
	}
	n := copy(p, r.b.data[r.off:])
	r.off += n
	return n, nil
}

func (r *followReader) Close() error { return nil }
