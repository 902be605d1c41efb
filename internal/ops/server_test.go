package ops

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// start serves s on a loopback port and returns its base URL; the server is shut down at
// the end of the test.
func start(t *testing.T, s *Server) string {
	t.Helper()
	addr, err := s.Start(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return "http://" + addr.String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func pass(context.Context) error { return nil }

func TestHealthz(t *testing.T) {
	// Liveness does not depend on readiness: failing checks and draining leave it 200.
	s := &Server{Checks: []Check{{Name: "broken", Func: func(context.Context) error { return errors.New("down") }}}}
	url := start(t, s)
	s.Drain()
	code, body := get(t, url+"/healthz")
	if code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 \"ok\\n\"", code, body)
	}
}

func TestReadyz(t *testing.T) {
	for _, tc := range []struct {
		name     string
		checks   []Check
		wantCode int
		want     []string // lines the body must contain
		dontWant []string
	}{
		{
			name:     "no checks",
			wantCode: http.StatusOK,
			want:     []string{"ok"},
		},
		{
			name:     "all pass",
			checks:   []Check{{Name: "ssh", Func: pass}, {Name: "registry", Func: pass}},
			wantCode: http.StatusOK,
			want:     []string{"[+]ssh ok", "[+]registry ok", "ok"},
		},
		{
			name: "one fails",
			checks: []Check{
				{Name: "ssh", Func: pass},
				{Name: "registry", Func: func(context.Context) error { return errors.New("dial tcp 127.0.0.1:5000: connection refused") }},
			},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[+]ssh ok", "[-]registry failed: dial tcp 127.0.0.1:5000: connection refused", "readyz check failed"},
			dontWant: []string{"ok"},
		},
		{
			name: "a check that honours its timeout",
			checks: []Check{{Name: "kubernetes", Timeout: 50 * time.Millisecond, Func: func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			}}},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[-]kubernetes failed: no answer within 50ms: context deadline exceeded", "readyz check failed"},
		},
		{
			name: "a check that ignores its context",
			checks: []Check{{Name: "stuck", Timeout: 50 * time.Millisecond, Func: func(context.Context) error {
				time.Sleep(time.Second)
				return nil
			}}},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[-]stuck failed: no answer within 50ms: context deadline exceeded"},
		},
		{
			name:     "a check that panics",
			checks:   []Check{{Name: "buggy", Func: func(context.Context) error { panic("oops") }}},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[-]buggy failed: check panicked: oops"},
		},
		{
			name:     "a check without a function",
			checks:   []Check{{Name: "empty"}},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[-]empty failed: check has no function"},
		},
		{
			name:     "a multi-line error stays on its line",
			checks:   []Check{{Name: "multi", Func: func(context.Context) error { return errors.New("first\nsecond") }}},
			wantCode: http.StatusServiceUnavailable,
			want:     []string{"[-]multi failed: first; second"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := start(t, &Server{Checks: tc.checks})
			code, body := get(t, url+"/readyz")
			if code != tc.wantCode {
				t.Errorf("/readyz: %d, want %d\n%s", code, tc.wantCode, body)
			}
			lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
			has := func(l string) bool {
				for _, got := range lines {
					if got == l {
						return true
					}
				}
				return false
			}
			for _, l := range tc.want {
				if !has(l) {
					t.Errorf("/readyz body lacks line %q:\n%s", l, body)
				}
			}
			for _, l := range tc.dontWant {
				if has(l) {
					t.Errorf("/readyz body has line %q:\n%s", l, body)
				}
			}
		})
	}
}

// TestReadyzFailsWhenContextEnds: Start drains as soon as its context ends, before anything
// else of shutdown happens.
func TestReadyzFailsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	s := &Server{Checks: []Check{{Name: "ssh", Func: pass}}}
	addr, err := s.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	url := "http://" + addr.String()
	if code, body := get(t, url+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before shutdown: %d\n%s", code, body)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := get(t, url+"/readyz")
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(body, "[-]shutdown failed: kpush is shutting down\n") {
				t.Errorf("/readyz while draining does not say why:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 5 s after the context ended", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, _ := get(t, url+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while draining: %d, want 200", code)
	}
}

// TestShutdownDrainsFirst: a /readyz request in flight when Shutdown begins answers 503, and
// Shutdown waits for it.
func TestShutdownDrainsFirst(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := &Server{Checks: []Check{{Name: "slow", Timeout: time.Minute, Func: func(context.Context) error {
		close(entered)
		<-release
		return nil
	}}}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()

	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Get("http://" + l.Addr().String() + "/readyz")
		if err != nil {
			t.Errorf("GET /readyz: %v", err)
			got <- result{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b)}
	}()
	<-entered
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	for !s.draining.Load() {
		time.Sleep(time.Millisecond)
	}
	close(release)
	r := <-got
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "[+]slow ok\n[-]shutdown failed") {
		t.Errorf("/readyz in flight at shutdown: %d\n%s\nwant 503 naming shutdown", r.code, r.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Shutdown: %v, want http.ErrServerClosed", err)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	t.Run("without metrics", func(t *testing.T) {
		url := start(t, &Server{})
		if code, _ := get(t, url+"/metrics"); code != http.StatusNotFound {
			t.Errorf("/metrics with nil Metrics: %d, want 404", code)
		}
	})
	t.Run("with metrics", func(t *testing.T) {
		m := NewMetrics()
		m.Failure(StageSource)
		url := start(t, &Server{Metrics: m})
		if v := value(series(t, scrape(t, url), "kpush_failures_total", "stage", StageSource)); v != 1 {
			t.Errorf("kpush_failures_total{stage=source} = %v, want 1", v)
		}
	})
}

func TestDialCheck(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := l.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := closed.Addr().String()
	closed.Close()
	t.Cleanup(func() { l.Close() })

	for _, tc := range []struct {
		addr    string
		wantErr bool
	}{{up, false}, {down, true}} {
		err := runCheck(t.Context(), DialCheck("ssh", tc.addr))
		if (err != nil) != tc.wantErr {
			t.Errorf("DialCheck(%s): %v, want error %v", tc.addr, err, tc.wantErr)
		}
	}
}

func TestHTTPCheck(t *testing.T) {
	status := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	withPassword := strings.Replace(gone.URL, "http://", "http://kpush:hunter2@", 1) + "/v2/"

	for _, tc := range []struct {
		name    string
		url     string
		wantErr string // "" for success
	}{
		{"200", status(http.StatusOK) + "/v2/", ""},
		{"401 from a registry that wants credentials is reachable", status(http.StatusUnauthorized) + "/v2/", ""},
		{"redirect is not followed and counts as reachable", status(http.StatusFound), ""},
		{"500", status(http.StatusInternalServerError), "500 Internal Server Error"},
		{"503", status(http.StatusServiceUnavailable), "503 Service Unavailable"},
		{"refused", withPassword, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := runCheck(t.Context(), HTTPCheck("registry", tc.url))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("HTTPCheck(%s): %v", tc.url, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("HTTPCheck(%s): %v, want an error containing %q", tc.url, err, tc.wantErr)
			case err != nil && strings.Contains(err.Error(), "hunter2"):
				t.Errorf("HTTPCheck error shows the URL's password: %v", err)
			}
		})
	}
}
