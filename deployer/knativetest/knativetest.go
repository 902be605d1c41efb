// Package knativetest runs a real Kubernetes API server with the Knative Serving CRDs for
// tests: controller-runtime's envtest drives the kube-apiserver and etcd binaries that
// `make tools` builds (internal/tools), on random loopback ports, so tests in several packages
// can each start their own server in parallel.
//
// By default no Knative controller or webhook runs: objects are validated only by the CRDs'
// OpenAPI schemas, and nothing writes status unless a test starts a StandIn (standin.go). A
// test that runs InPrivateNetwork can start Knative Serving's real controller and webhook with
// StartServing (serving_linux.go).
package knativetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"kpush.dev/kpush/internal/tools"
)

const servingModule = "knative.dev/serving"

// crdSubdir is where knative.dev/serving keeps the serving.knative.dev CRDs.
const crdSubdir = "config/core/300-resources"

var quietOnce sync.Once

// Env is a running kube-apiserver + etcd pair with the Knative Serving CRDs installed.
type Env struct {
	// Config reaches the API server as an admin (group system:masters) over TLS with a
	// client certificate.
	Config *rest.Config
	env    *envtest.Environment
}

// New starts kube-apiserver and etcd from the tools directory (tools.Path) on random loopback
// ports and installs the CRDs from knative.dev/serving's config/core/300-resources. It takes
// about 3 s. The error says "run make tools" when a binary is missing. Stop ends both
// processes; use Start in tests, New in TestMain.
func New() (*Env, error) {
	quietOnce.Do(func() { ctrllog.SetLogger(logr.Discard()) }) // envtest logs through controller-runtime's global logger

	apiserver, err := tools.Path("kube-apiserver")
	if err != nil {
		return nil, fmt.Errorf("finding kube-apiserver (run make tools): %w", err)
	}
	etcd, err := tools.Path("etcd")
	if err != nil {
		return nil, fmt.Errorf("finding etcd (run make tools): %w", err)
	}
	crds, err := ServingCRDDir()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: filepath.Dir(apiserver),
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		// Paths set explicitly so that a stray KUBEBUILDER_ASSETS or TEST_ASSET_* in the
		// environment cannot swap in other binaries.
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{Path: apiserver},
			Etcd:      &envtest.Etcd{Path: etcd},
		},
		ControlPlaneStartTimeout: 60 * time.Second, // 2 shared cores; other packages start theirs too
		ControlPlaneStopTimeout:  20 * time.Second,
	}
	if checkPrivateNetwork() == nil {
		// In a private network namespace (InPrivateNetwork) there is no default route to pick
		// an advertise address from; kube-apiserver would refuse to start.
		te.ControlPlane.APIServer.Configure().Set("advertise-address", "127.0.0.1")
	}
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("starting kube-apiserver %s and etcd %s: %w", apiserver, etcd, err)
	}
	return &Env{Config: cfg, env: te}, nil
}

// Stop ends kube-apiserver and etcd and removes their temporary directories.
func (e *Env) Stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stopping envtest control plane: %w", err)
	}
	return nil
}

// Start starts an Env for the test (see New) and stops it on t.Cleanup. A missing binary
// fails the test ("run make tools"); it is never skipped.
func Start(t testing.TB) *rest.Config {
	t.Helper()
	e, err := New()
	if err != nil {
		t.Fatalf("knativetest: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("knativetest: %v", err)
		}
	})
	return e.Config
}

// Main is a TestMain body for a package whose tests share one Env: it starts the Env, points
// *cfg at it, runs the tests and stops the Env. It returns the exit code for os.Exit; an Env
// that fails to start fails the package (exit 1, "run make tools" when a binary is missing).
func Main(m *testing.M, cfg **rest.Config) int {
	env, err := New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: knativetest: %v\n", err)
		return 1
	}
	*cfg = env.Config
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "knativetest: %v\n", err)
	}
	return code
}

// ServingCRDDir returns the absolute path of knative.dev/serving's config/core/300-resources
// directory in the module cache: from the test binary's build info ($GOMODCACHE, else
// `go env GOMODCACHE`, + the module version),
// else from `go list -m -f {{.Dir}} knative.dev/serving` in the working directory.
func ServingCRDDir() (string, error) {
	if dir := crdDirFromBuildInfo(); dir != "" {
		return dir, nil
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", servingModule).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("locating module %s (run go mod download): %w", servingModule, err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), crdSubdir)
	if _, err := os.Stat(filepath.Join(dir, "service.yaml")); err != nil {
		return "", fmt.Errorf("locating Knative Serving CRDs (run go mod download %s): %w", servingModule, err)
	}
	return dir, nil
}

func crdDirFromBuildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range bi.Deps {
		if m.Path != servingModule {
			continue
		}
		if m.Replace != nil {
			if m.Replace.Version == "" { // local directory replacement
				return existing(filepath.Join(m.Replace.Path, crdSubdir))
			}
			m = m.Replace
		}
		cache := os.Getenv("GOMODCACHE")
		if cache == "" {
			out, err := exec.Command("go", "env", "GOMODCACHE").Output()
			if err != nil {
				return ""
			}
			cache = strings.TrimSpace(string(out))
		}
		return existing(filepath.Join(cache, m.Path+"@"+m.Version, crdSubdir))
	}
	return ""
}

func existing(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "service.yaml")); err != nil {
		return ""
	}
	return dir
}

// Kubeconfig returns a kubeconfig (YAML) with one cluster, user and current context that
// reach the server cfg points at, for another process (e.g. `kpush serve --kubeconfig`).
// The client certificate, key and CA are embedded as data.
func Kubeconfig(cfg *rest.Config, namespace string) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest", Namespace: namespace}
	kc.CurrentContext = "envtest"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("encoding kubeconfig: %w", err)
	}
	return b, nil
}

// WriteKubeconfig writes Kubeconfig(cfg, namespace) to a file in t.TempDir() with mode 0600
// and returns its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config, namespace string) string {
	t.Helper()
	b, err := Kubeconfig(cfg, namespace)
	if err != nil {
		t.Fatalf("knativetest: %v", err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatalf("knativetest: writing kubeconfig: %v", err)
	}
	return p
}

// Namespace creates a namespace with a random name ("kpush-test-<8 hex>") so that tests
// sharing one Env don't see each other's objects, and deletes it on t.Cleanup (without
// waiting: envtest runs no namespace controller, so it stays Terminating).
func Namespace(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("knativetest: building clientset: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "kpush-test-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("knativetest: creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = kc.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}
