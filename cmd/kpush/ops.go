package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"
	"k8s.io/client-go/discovery"

	"kpush.dev/kpush/internal/ops"
)

// opsFlags registers --ops-addr, the address of the operations endpoints (/healthz, /readyz,
// /metrics), defaulting to def, or $KPUSH_OPS_ADDR (applyEnv). Empty turns them off.
//
// serve uses ":8081": the kubelet probes and Prometheus scrapes the pod IP. dev uses
// "127.0.0.1:0": a free loopback port, logged at start, so a second `kpush dev` or another
// program on 8081 never stops dev from starting; pass --ops-addr 127.0.0.1:8081 to fix it.
func opsFlags(fs *pflag.FlagSet, def string) *string {
	addr := fs.String("ops-addr", def,
		"address of the operations endpoints /healthz, /readyz and /metrics; empty turns them off (env KPUSH_OPS_ADDR)")
	bindEnv(fs, map[string]string{"ops-addr": "KPUSH_OPS_ADDR"})
	return addr
}

// logConfig is how kpush logs: --log-format json|text, --log-level debug|info|warn|error.
type logConfig struct {
	Format string
	Level  string
}

func (c *logConfig) flags(fs *pflag.FlagSet, defFormat string) {
	fs.StringVar(&c.Format, "log-format", defFormat, "log format: json or text (env KPUSH_LOG_FORMAT)")
	fs.StringVar(&c.Level, "log-level", "info", "least severe level logged: debug, info, warn or error (env KPUSH_LOG_LEVEL)")
	bindEnv(fs, map[string]string{"log-format": "KPUSH_LOG_FORMAT", "log-level": "KPUSH_LOG_LEVEL"})
}

// logger returns the logger c describes, writing to w.
func (c *logConfig) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.Level)
	}
	log, err := ops.NewLogger(w, strings.ToLower(c.Format), level)
	if err != nil {
		return nil, fmt.Errorf("--log-format %q: want json or text", c.Format)
	}
	return log, nil
}

// startOps serves /healthz, /readyz (checks) and /metrics (m) on addr until shutdown is
// called; /readyz fails from the moment ctx ends, so that traffic drains while running
// pushes finish. Call shutdown last, after the git server stopped and builds finished, so
// that probes and scrapes see the whole shutdown. An empty addr serves nothing and returns a
// shutdown that does nothing.
func startOps(ctx context.Context, addr string, log *slog.Logger, m *ops.Metrics, checks ...ops.Check) (shutdown func(context.Context) error, err error) {
	if addr == "" {
		return func(context.Context) error { return nil }, nil
	}
	s := &ops.Server{Metrics: m, Checks: checks, Log: log}
	a, err := s.Start(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%w (choose another with --ops-addr, or turn them off with --ops-addr '')", err)
	}
	log.Info("operations endpoints", "addr", a.String(), "paths", "/healthz /readyz /metrics")
	return s.Shutdown, nil
}

// stopOps calls shutdown (from startOps) with a few seconds to answer the requests in flight,
// logging a failure: the deferred last step of serve and dev.
func stopOps(shutdown func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		log.Warn("stopping the operations endpoints", "err", err)
	}
}

// registryCheck passes while the registry of the repository prefix (e.g.
// "registry.example.com/kpush") answers on /v2/ (401 counts: reachable), over http for
// loopback and private addresses as the image pushes do (ggcr name.Registry.Scheme).
func registryCheck(prefix string) (ops.Check, error) {
	repo, err := name.NewRepository(prefix)
	if err != nil {
		return ops.Check{}, fmt.Errorf("--registry %q: %w", prefix, err)
	}
	r := repo.Registry
	return ops.HTTPCheck("registry", r.Scheme()+"://"+r.RegistryStr()+"/v2/"), nil
}

// kubeCheck passes while the Kubernetes API server answers GET /readyz, which every
// authenticated client may read (the system:public-info-viewer role).
func kubeCheck(d discovery.DiscoveryInterface) ops.Check {
	return ops.Check{Name: "kubernetes", Func: func(ctx context.Context) error {
		_, err := d.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}}
}
