package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	"k8s.io/client-go/discovery"

	"kpush.dev/kpush/deployer/knativetest"
	"kpush.dev/kpush/internal/ops"
)

// TestStartOps serves the operations endpoints on a free loopback port, as `kpush dev` does,
// and checks /readyz turns 503 when the command's context ends.
func TestStartOps(t *testing.T) {
	var logs bytes.Buffer
	log, err := ops.NewLogger(&logs, ops.LogJSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	m := ops.NewMetrics()
	m.PushFinished(ops.PushAccepted)
	shutdown, err := startOps(ctx, "127.0.0.1:0", log, m, ops.Check{Name: "ok", Func: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ Msg, Addr string }
	if err := json.Unmarshal(logs.Bytes(), &rec); err != nil || rec.Msg != "operations endpoints" || rec.Addr == "" {
		t.Fatalf("startOps did not log its address (%v):\n%s", err, logs.String())
	}
	base := "http://" + rec.Addr

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d\n%s", code, body)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, `kpush_pushes_total{result="accepted"} 1`) {
		t.Errorf("/metrics: %d, no kpush_pushes_total{result=\"accepted\"} 1:\n%.2000s", code, body)
	}
	cancel()
	// Drain runs on the context's AfterFunc goroutine; readiness is checked until it shows.
	for i := 0; ; i++ {
		code, _ := get("/readyz")
		if code == http.StatusServiceUnavailable {
			break
		}
		if i == 500 {
			t.Fatalf("/readyz still %d after the context ended", code)
		}
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("/healthz still answers after shutdown")
	}
}

func TestStartOpsOff(t *testing.T) {
	shutdown, err := startOps(t.Context(), "", slog.New(slog.DiscardHandler), nil)
	if err != nil || shutdown(t.Context()) != nil {
		t.Fatalf("startOps with no address: %v", err)
	}
}

func TestLogConfig(t *testing.T) {
	for _, tc := range []struct {
		format, level string
		wantErr       string
	}{
		{"json", "info", ""},
		{"TEXT", "debug", ""},
		{"json", "warn", ""},
		{"xml", "info", "--log-format"},
		{"json", "loud", "--log-level"},
	} {
		c := logConfig{Format: tc.format, Level: tc.level}
		_, err := c.logger(io.Discard)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("logConfig%+v: %v, want error %q", c, err, tc.wantErr)
		}
	}
}

func TestRegistryCheck(t *testing.T) {
	reg := httptest.NewServer(registry.New())
	addr := strings.TrimPrefix(reg.URL, "http://")
	c, err := registryCheck(addr + "/kpush")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Func(t.Context()); err != nil {
		t.Errorf("registry check against a running registry: %v", err)
	}
	reg.Close()
	if err := c.Func(t.Context()); err == nil {
		t.Error("registry check passed with the registry stopped")
	}
	if _, err := registryCheck("Not A Registry//x"); err == nil {
		t.Error("registryCheck accepted an invalid repository prefix")
	}
}

func TestKubeCheck(t *testing.T) {
	env, err := knativetest.New()
	if err != nil {
		t.Fatalf("knativetest: %v", err)
	}
	d, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := kubeCheck(d)
	if err := c.Func(t.Context()); err != nil {
		t.Errorf("kubernetes check against a running kube-apiserver: %v", err)
	}
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Func(t.Context()); err == nil {
		t.Error("kubernetes check passed with kube-apiserver stopped")
	}
}
