package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCheckTimeout bounds a Check with no Timeout of its own. Keep the readiness probe's
// timeoutSeconds above the longest check timeout.
const DefaultCheckTimeout = 2 * time.Second

// Check is one readiness condition: kpush is ready to take pushes only while every check
// passes.
type Check struct {
	// Name identifies the check in /readyz output and logs, e.g. "ssh", "registry".
	Name string
	// Func returns nil when the condition holds. It must return soon after ctx ends; its
	// error is shown to people on /readyz, so it must not contain secrets.
	Func func(ctx context.Context) error
	// Timeout bounds one run of Func; 0 means DefaultCheckTimeout.
	Timeout time.Duration
}

// DialCheck passes while a TCP connection to addr (HOST:PORT) can be opened, e.g. kpush's own
// SSH listener. An empty host dials the local system.
func DialCheck(name, addr string) Check {
	return Check{Name: name, Func: func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}}
}

// HTTPCheck passes while a GET of rawURL gets any HTTP response below 500. A registry's
// /v2/ endpoint answers 401 without credentials: reachable, so ready. Redirects are not
// followed. The error names the URL without its password.
func HTTPCheck(name, rawURL string) Check {
	shown := rawURL
	if u, err := url.Parse(rawURL); err == nil {
		shown = u.Redacted()
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return Check{Name: name, Func: func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
		if err != nil {
			return fmt.Errorf("GET %s: %w", shown, err)
		}
		resp, err := client.Do(req)
		if err != nil {
			var uerr *url.Error
			if errors.As(err, &uerr) {
				err = uerr.Err // its URL may hold a password
			}
			return fmt.Errorf("GET %s: %w", shown, err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			return fmt.Errorf("GET %s: %s", shown, resp.Status)
		}
		return nil
	}}
}

// Server serves kpush's operations endpoints over HTTP:
//
//	GET /healthz  200 "ok" while the process serves HTTP (liveness)
//	GET /readyz   200 when every Check passes and Drain has not been called, else 503;
//	              the text body has one line per check, "[+]name ok" or "[-]name failed: why",
//	              then "ok" or "readyz check failed" (the kube-apiserver's layout)
//	GET /metrics  Metrics.Handler (Prometheus exposition)
//
// Set the fields before Handler or Serve; a zero Server serves /healthz, a /readyz with no
// checks and a /metrics that answers 404.
type Server struct {
	Metrics *Metrics
	Checks  []Check
	// Log gets readiness changes (failing check names and errors). Nil: discarded.
	Log *slog.Logger

	draining atomic.Bool
	ready    atomic.Int32 // last /readyz outcome: 0 unknown, 1 ready, 2 not ready
	once     sync.Once
	srv      *http.Server
}

// Handler returns the operations endpoints as one http.Handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", s.Metrics.Handler())
	return mux
}

// Drain makes /readyz answer 503 from now on, so that load balancers and Kubernetes stop
// sending new connections while running pushes finish. Shutdown calls it too.
func (s *Server) Drain() {
	if !s.draining.Swap(true) {
		s.logger().Info("draining: /readyz now fails")
	}
}

// Serve serves Handler on l until Shutdown, then returns http.ErrServerClosed. It closes l.
func (s *Server) Serve(l net.Listener) error {
	return s.httpServer().Serve(l)
}

// Start listens on addr (HOST:PORT; port 0 picks a free one), serves in the background and
// drains (see Drain) as soon as ctx ends, so /readyz fails from the first moment of
// shutdown. It returns the address it listens on. Stop it with Shutdown; Serve's errors
// other than http.ErrServerClosed go to Log.
func (s *Server) Start(ctx context.Context, addr string) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for the operations endpoints on %s: %w", addr, err)
	}
	go func() {
		if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger().Error("serving the operations endpoints", "addr", l.Addr().String(), "err", err)
		}
	}()
	context.AfterFunc(ctx, s.Drain)
	return l.Addr(), nil
}

// Shutdown drains (see Drain), then stops the HTTP server gracefully: it waits for open
// requests until ctx ends, then returns ctx's error (http.Server.Shutdown). Safe to call when
// Serve was never called.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	return s.httpServer().Shutdown(ctx)
}

func (s *Server) httpServer() *http.Server {
	s.once.Do(func() {
		s.srv = &http.Server{
			Handler:           s.Handler(),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      time.Minute,
			ErrorLog:          slog.NewLogLogger(s.logger().Handler(), slog.LevelWarn),
		}
	})
	return s.srv
}

type checkResult struct {
	name string
	err  error
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	results := make([]checkResult, len(s.Checks))
	var wg sync.WaitGroup
	for i, c := range s.Checks {
		wg.Go(func() { results[i] = checkResult{c.Name, runCheck(r.Context(), c)} })
	}
	wg.Wait()
	if s.draining.Load() {
		results = append(results, checkResult{"shutdown", errors.New("kpush is shutting down")})
	}

	var b strings.Builder
	var failed []string
	for _, res := range results {
		if res.err == nil {
			fmt.Fprintf(&b, "[+]%s ok\n", res.name)
			continue
		}
		failed = append(failed, res.name)
		fmt.Fprintf(&b, "[-]%s failed: %s\n", res.name, oneLine(res.err.Error()))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if len(failed) > 0 {
		b.WriteString("readyz check failed\n")
		w.WriteHeader(http.StatusServiceUnavailable)
		s.noteReady(false, failed, results)
	} else {
		b.WriteString("ok\n")
		s.noteReady(true, nil, nil)
	}
	w.Write([]byte(b.String()))
}

// noteReady logs when readiness changes, not on every probe.
func (s *Server) noteReady(ok bool, failed []string, results []checkResult) {
	state := int32(2)
	if ok {
		state = 1
	}
	if s.ready.Swap(state) == state {
		return
	}
	if ok {
		s.logger().Info("ready")
		return
	}
	var why []string
	for _, r := range results {
		if r.err != nil {
			why = append(why, r.name+": "+oneLine(r.err.Error()))
		}
	}
	s.logger().Warn("not ready", "failed", failed, "err", strings.Join(why, "; "))
}

// runCheck runs c under its timeout. It returns at the timeout even if c ignores its
// context (c's goroutine then ends on its own), and a panic in c fails the check instead of
// the process.
func runCheck(ctx context.Context, c Check) error {
	if c.Func == nil {
		return errors.New("check has no function")
	}
	d := c.Timeout
	if d <= 0 {
		d = DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("check panicked: %v", p)
			}
		}()
		done <- c.Func(ctx)
	}()
	select {
	case err := <-done:
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("no answer within %s: %w", d, err)
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s: %w", d, ctx.Err())
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

func (s *Server) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}
