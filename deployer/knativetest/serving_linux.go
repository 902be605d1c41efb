package knativetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"kpush.dev/kpush/internal/tools"
)

// SystemNamespace is where StartServing installs Knative Serving's configuration.
const SystemNamespace = "knative-serving"

// QueueSidecarImage is the queue-proxy image StartServing configures (config-deployment
// queue-sidecar-image). Knative needs it by digest to reconcile without a registry; no pod
// ever runs, so nothing pulls it.
const QueueSidecarImage = "registry.invalid/knative/queue@sha256:0000000000000000000000000000000000000000000000000000000000000000"

// webhookPort is where the webhook serves TLS; the "webhook" Service (ExternalName
// localhost) points the API server there.
const webhookPort = 8443

// Module paths whose config/ directories StartServing installs from.
const (
	networkingModule = "knative.dev/networking"
	cachingModule    = "knative.dev/caching"
)

// Serving is Knative Serving's real controller and webhook (the knative-controller and
// knative-webhook binaries `make tools` builds from knative.dev/serving v0.50.0 cmd/controller
// and cmd/webhook) running against an Env.
type Serving struct {
	// ControllerLog and WebhookLog are the files the processes write stdout and stderr to
	// (in a t.TempDir); their tails are logged when the test fails.
	ControllerLog, WebhookLog string
}

// StartServing installs what Knative Serving needs beside the CRDs New installs — the
// networking.internal.knative.dev and caching.internal.knative.dev CRDs, the knative-serving
// namespace with the ConfigMaps of config/core/configmaps and config-network (config-deployment
// with queue-sidecar-image QueueSidecarImage), the webhook-certs Secret, the webhook
// configurations of config/core/webhooks and a "webhook" Service of type ExternalName to
// localhost — then starts the controller and the webhook with a kubeconfig for cfg, and
// returns once the webhook rejects an invalid Service (2 s here; it waits up to 2 min). Then
// Services are defaulted and validated by the real webhook and reconciled into Configurations,
// Revisions, Routes and Deployments; nothing becomes Ready (no autoscaler, no ingress, no pods),
// and images must be given by digest.
//
// It must run inside InPrivateNetwork, once per private network: the controller and webhook
// listen on fixed ports (webhook 8443) on all interfaces. A missing binary fails the test
// ("run make tools"). Both processes are ended by PID on t.Cleanup (SIGTERM, then SIGKILL
// after 10 s), before the Env stops.
func StartServing(t testing.TB, cfg *rest.Config) *Serving {
	t.Helper()
	if err := checkPrivateNetwork(); err != nil {
		t.Fatalf("knativetest: StartServing: %v", err)
	}
	controller, err := tools.Path("knative-controller")
	if err != nil {
		t.Fatalf("knativetest: finding knative-controller (run make tools): %v", err)
	}
	webhook, err := tools.Path("knative-webhook")
	if err != nil {
		t.Fatalf("knativetest: finding knative-webhook (run make tools): %v", err)
	}
	if err := installServing(t, cfg); err != nil {
		t.Fatalf("knativetest: installing Knative Serving's configuration: %v", err)
	}

	kubeconfig := WriteKubeconfig(t, cfg, SystemNamespace)
	logs := t.TempDir()
	s := &Serving{
		WebhookLog:    filepath.Join(logs, "webhook.log"),
		ControllerLog: filepath.Join(logs, "controller.log"),
	}
	// Distinct ports per process; the network namespace is the test's own.
	wh := startProcess(t, webhook, s.WebhookLog, kubeconfig,
		"POD_NAME=webhook", "WEBHOOK_NAME=webhook", "WEBHOOK_PORT="+fmt.Sprint(webhookPort), "PROFILING_PORT=8018", "METRICS_PROMETHEUS_PORT=9018")
	ctl := startProcess(t, controller, s.ControllerLog, kubeconfig,
		"POD_NAME=controller", "PROFILING_PORT=8019", "METRICS_PROMETHEUS_PORT=9019")

	t0 := time.Now()
	if err := waitWebhook(cfg, 2*time.Minute, wh, ctl); err != nil {
		t.Fatalf("knativetest: the Knative webhook did not start answering: %v (logs below)", err)
	}
	t.Logf("knativetest: Knative Serving's webhook answered %s after start", time.Since(t0).Round(time.Millisecond))
	return s
}

// process is a started binary; done is closed when it has exited.
type process struct {
	name string
	done chan struct{}
	err  error // valid after done is closed
}

// startProcess starts bin with the kubeconfig, SYSTEM_NAMESPACE and env, writing its output
// to logPath, and ends it on t.Cleanup; on failure the log's tail goes to t.Log.
func startProcess(t testing.TB, bin, logPath, kubeconfig string, env ...string) *process {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("knativetest: creating %s: %v", logPath, err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig)
	cmd.Env = append(os.Environ(), "SYSTEM_NAMESPACE="+SystemNamespace)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed if the test binary dies (strictly: the OS thread that started it); the PID
	// namespace of InPrivateNetwork is the guarantee, this is a second one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("knativetest: starting %s: %v", bin, err)
	}
	p := &process{name: filepath.Base(bin), done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		defer logf.Close()
		select {
		case <-p.done: // it should not have ended on its own
			t.Errorf("knativetest: %s (pid %d) exited early: %v", p.name, cmd.Process.Pid, p.err)
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("knativetest: last lines of %s's log %s:\n%s", p.name, logPath, tail(logPath, 40))
		}
	})
	return p
}

// tail returns the last n lines of the file at path, each cut to 500 bytes.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 500 {
			lines[i] = l[:500] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// waitWebhook waits until a dry-run create of an invalid Service is denied by the Knative
// validation webhook itself (not refused because the webhook cannot be reached yet). It
// gives up early when one of procs exits.
func waitWebhook(cfg *rest.Config, timeout time.Duration, procs ...*process) error {
	cs, err := servingclientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	probe := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "knativetest-webhook-probe", Namespace: SystemNamespace}}
	// The reserved env name K_SERVICE: only the webhook refuses it, the CRD schema does not.
	probe.Spec.Template.Spec.Containers = []corev1.Container{{
		Image: "registry.invalid/probe@sha256:" + strings.Repeat("0", 64),
		Env:   []corev1.EnvVar{{Name: "K_SERVICE", Value: "probe"}},
	}}
	var last error
	for {
		_, err := cs.ServingV1().Services(SystemNamespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			last = errors.New("an invalid Service was accepted (the webhook configurations are not in effect yet)")
		case strings.Contains(err.Error(), `admission webhook "validation.webhook.serving.knative.dev" denied the request`):
			return nil
		default:
			last = err
		}
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited: %v", p.name, p.err)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// installServing installs the CRDs and configuration StartServing describes.
func installServing(t testing.TB, cfg *rest.Config) error {
	crds, err := ServingCRDDir()
	if err != nil {
		return err
	}
	core := filepath.Dir(crds) // config/core
	servingDir := filepath.Dir(filepath.Dir(core))
	networking, err := requiredModuleDir(t, servingDir, networkingModule)
	if err != nil {
		return err
	}
	caching, err := requiredModuleDir(t, servingDir, cachingModule)
	if err != nil {
		return err
	}
	_, err = envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{
			filepath.Join(networking, "config", "certificate.yaml"),
			filepath.Join(networking, "config", "domain-claim.yaml"),
			filepath.Join(networking, "config", "ingress.yaml"),
			filepath.Join(networking, "config", "serverlessservice.yaml"),
			filepath.Join(caching, "config", "image.yaml"),
		},
		ErrorIfPathMissing: true,
		MaxTime:            time.Minute,
	})
	if err != nil {
		return fmt.Errorf("installing the networking and caching CRDs: %w", err)
	}

	files := []string{filepath.Join(core, "100-namespace.yaml")}
	cms, err := filepath.Glob(filepath.Join(core, "configmaps", "*.yaml"))
	if err != nil || len(cms) == 0 {
		return fmt.Errorf("no ConfigMaps in %s", filepath.Join(core, "configmaps"))
	}
	files = append(files, cms...)
	files = append(files,
		filepath.Join(networking, "config", "config-network.yaml"),
		filepath.Join(core, "webhooks", "secret.yaml"),
		// Webhook configurations last: from then on writes they cover need the webhook.
		filepath.Join(core, "webhooks", "configmap-validation.yaml"),
		filepath.Join(core, "webhooks", "defaulting.yaml"),
		filepath.Join(core, "webhooks", "resource-validation.yaml"),
	)
	var objs []runtime.Object
	for _, f := range files {
		o, err := readObjects(f)
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building clientset: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created := false
	for _, o := range objs {
		if err := create(ctx, kc, o); err != nil {
			return err
		}
		if _, isNS := o.(*corev1.Namespace); isNS && !created {
			created = true
			// The webhook's Service, right after the namespace: the API server reaches
			// service webhook.knative-serving:8443 at localhost:8443, and checks the
			// certificate for webhook.knative-serving.svc.
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "webhook", Namespace: SystemNamespace},
				Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
			}
			if err := create(ctx, kc, svc); err != nil {
				return err
			}
		}
	}
	return nil
}

// create creates o (of a kind installServing handles), adjusted for running outside a cluster.
func create(ctx context.Context, kc kubernetes.Interface, o runtime.Object) error {
	var err error
	var what string
	port := int32(webhookPort)
	switch o := o.(type) {
	case *corev1.Namespace:
		what = "Namespace " + o.Name
		_, err = kc.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Service:
		what = "Service " + o.Name
		_, err = kc.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.ConfigMap:
		what = "ConfigMap " + o.Name
		if o.Name == "config-deployment" {
			o.Data["queue-sidecar-image"] = QueueSidecarImage
		}
		_, err = kc.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Secret:
		what = "Secret " + o.Name
		_, err = kc.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *admissionv1.MutatingWebhookConfiguration:
		what = "MutatingWebhookConfiguration " + o.Name
		for i := range o.Webhooks {
			o.Webhooks[i].ClientConfig.Service.Port = &port
		}
		_, err = kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, o, metav1.CreateOptions{})
	case *admissionv1.ValidatingWebhookConfiguration:
		what = "ValidatingWebhookConfiguration " + o.Name
		for i := range o.Webhooks {
			o.Webhooks[i].ClientConfig.Service.Port = &port
		}
		_, err = kc.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, o, metav1.CreateOptions{})
	default:
		return fmt.Errorf("knativetest cannot install a %T", o)
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", what, err)
	}
	return nil
}

// readObjects decodes every document of the YAML file at path that has a kind.
func readObjects(path string) ([]runtime.Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		o, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if runtime.IsMissingKind(err) { // a document of comments only
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		objs = append(objs, o)
	}
}

// requiredModuleDir returns the module cache directory of module at the version
// knative.dev/serving's go.mod (in servingDir) requires — the version the tools build links,
// since tools/knative requires only knative.dev/serving. If the module cache lacks it, it is
// downloaded with `go mod download` (from outside any module, so no go.mod changes).
func requiredModuleDir(t testing.TB, servingDir, module string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(servingDir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("reading knative.dev/serving's go.mod: %w", err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(gomod)
	if m == nil {
		return "", fmt.Errorf("%s/go.mod does not require %s", servingDir, module)
	}
	version := string(m[1])
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("running go env GOMODCACHE: %w", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	// Knative's module paths are lower case, so no case-encoding is needed (golang.org/x/mod/module.EscapePath).
	dir := filepath.Join(cache, module+"@"+version)
	if fi, err := os.Stat(filepath.Join(dir, "config")); err == nil && fi.IsDir() {
		return dir, nil
	}
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", module, version, err, strings.TrimSpace(stderr.String()))
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s printed no directory: %s", module, version, out)
	}
	return info.Dir, nil
}
