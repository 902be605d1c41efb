package local

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"kpush.dev/kpush/internal/names"
)

// HostSuffix is the domain every app is served under: app "demo" answers at
// "demo.localhost" on the router's port. Names under .localhost resolve to loopback without
// DNS setup (RFC 6761 §6.3; curl and browsers do this themselves).
const HostSuffix = ".localhost"

// URL returns where app is served by a router listening on routerPort:
// "http://<app>.localhost:<routerPort>/".
func URL(app string, routerPort int) string {
	return fmt.Sprintf("http://%s%s:%d/", app, HostSuffix, routerPort)
}

// Router is an http.Handler that sends each request to the app named by its Host header,
// "<app>.localhost[:port]" (case-insensitive, a trailing dot allowed), through a reverse proxy
// to the app's current process on 127.0.0.1. Answers of its own:
//   - 400 for a Host that is not "<DNS-1035 label>.localhost" (the header is not echoed),
//   - 404 "no app named X" for an app it does not know,
//   - 503 for an app it knows that has no running process,
//   - 502 when the app's process does not answer.
//
// The zero value is not usable; make one with NewRouter. Safe for concurrent use.
type Router struct {
	log *slog.Logger

	mu     sync.RWMutex
	routes map[string]*route // app → backend; a nil *route means known but not running
}

type route struct {
	addr  string // "127.0.0.1:<port>"
	proxy *httputil.ReverseProxy
	tr    *http.Transport // its own connections to the backend
}

// NewRouter returns a Router with no apps. log receives proxy errors (nil: discarded).
func NewRouter(log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Router{log: log, routes: map[string]*route{}}
}

// Set points app at the backend listening on addr ("host:port"), reached through dial (nil:
// the host's network), replacing any earlier backend atomically: requests that already
// started finish on the old one.
func (rt *Router) Set(app, addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	target := &url.URL{Scheme: "http", Host: addr}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if dial != nil {
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) { return dial(ctx, network, addr) }
	}
	p := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the app sees the Host the client used
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rt.log.Warn("proxying to app failed", "app", app, "backend", addr, "err", err)
			http.Error(w, fmt.Sprintf("app %s is not answering; see its log", app), http.StatusBadGateway)
		},
	}
	rt.mu.Lock()
	old := rt.routes[app]
	rt.routes[app] = &route{addr: addr, proxy: p, tr: tr}
	rt.mu.Unlock()
	if old != nil {
		old.tr.CloseIdleConnections() // requests under way finish on their connections
	}
}

// Down marks app as known but not running: requests get 503 until the next Set.
func (rt *Router) Down(app string) {
	rt.mu.Lock()
	rt.routes[app] = nil
	rt.mu.Unlock()
}

// Remove forgets app: requests get 404.
func (rt *Router) Remove(app string) {
	rt.mu.Lock()
	delete(rt.routes, app)
	rt.mu.Unlock()
}

// Backend returns the address app is routed to and whether it has one.
func (rt *Router) Backend(app string) (string, bool) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	r := rt.routes[app]
	if r == nil {
		return "", false
	}
	return r.addr, true
}

// AppFromHost extracts the app name from a Host header value, or reports false when host is
// not "<DNS-1035 label>.localhost" with an optional port and trailing dot.
func AppFromHost(host string) (string, bool) {
	if len(host) > 300 {
		return "", false
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	app, ok := strings.CutSuffix(h, HostSuffix)
	if !ok || !names.IsApp(app) {
		return "", false
	}
	return app, true
}

// ServeHTTP implements http.Handler.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	app, ok := AppFromHost(r.Host)
	if !ok {
		http.Error(w, "kpush: address an app as http://<app>.localhost:<port>/", http.StatusBadRequest)
		return
	}
	rt.mu.RLock()
	rte, known := rt.routes[app]
	rt.mu.RUnlock()
	switch {
	case !known:
		http.Error(w, fmt.Sprintf("no app named %s; push one with git push", app), http.StatusNotFound)
	case rte == nil:
		http.Error(w, fmt.Sprintf("app %s is not running; see its log or push again", app), http.StatusServiceUnavailable)
	default:
		rte.proxy.ServeHTTP(w, r)
	}
}
