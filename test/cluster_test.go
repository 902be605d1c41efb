package test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/deployer/knativetest"
)

// cluster is what `kpush serve` runs against in tests: a real kube-apiserver + etcd with the
// Knative Serving CRDs in a namespace of its own, knativetest.StandIn marking Services Ready in
// place of the Knative controller (which does not run here), and a real OCI registry
// (go-containerregistry's) on loopback.
type cluster struct {
	ctx        context.Context // ends at test cleanup
	cs         servingclientset.Interface
	ns         string
	kubeconfig string // file reaching the apiserver, for kpush serve
	registry   string // repository prefix "127.0.0.1:PORT/kpush"
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	requireTools(t, "lifecycle", "launcher", "bwrap", "busybox", "kube-apiserver", "etcd")
	cfg := knativetest.Start(t)
	ns := knativetest.Namespace(t, cfg)
	cs, err := servingclientset.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	knativetest.StartStandIn(ctx, t, cs, ns)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := &httptest.Server{Listener: l, Config: &http.Server{Handler: ggcrregistry.New()}}
	reg.Start()
	t.Cleanup(reg.Close)
	return &cluster{ctx: ctx, cs: cs, ns: ns,
		kubeconfig: knativetest.WriteKubeconfig(t, cfg, ns), registry: l.Addr().String() + "/kpush"}
}

// serve starts `kpush serve` against c on a fresh SSH port, with data dir data, the key whose
// public half is key+".pub" as its first admin, and extra flags.
func (c *cluster) serve(t *testing.T, data, key string, extra ...string) *server {
	t.Helper()
	addr := freeAddr(t)
	s := start(t, addr, append([]string{"serve",
		"--kubeconfig", c.kubeconfig,
		"--namespace", c.ns,
		"--registry", c.registry,
		"--data", data,
		"--ssh-addr", addr,
		"--authorized-keys", key + ".pub",
		"--ready-timeout", "1m"}, extra...)...)
	s.key = key
	return s
}
