package local

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRouter(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "demo host=%s path=%s", r.Host, r.URL.Path)
	}))
	defer backend.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close()

	rt := NewRouter(nil)
	rt.Set("demo", backend.Listener.Addr().String(), nil)
	rt.Down("sleepy")
	rt.Set("gone", deadAddr, nil)
	rt.Set("removed", deadAddr, nil)
	rt.Remove("removed")
	srv := httptest.NewServer(rt)
	defer srv.Close()

	tests := []struct {
		name, host string
		code       int
		body       string
	}{
		{"app", "demo.localhost", 200, "demo host=demo.localhost path=/x"},
		{"app with port", "demo.localhost:8080", 200, "demo host=demo.localhost:8080 path=/x"},
		{"upper case", "DEMO.LocalHost", 200, "demo host=DEMO.LocalHost path=/x"},
		{"trailing dot", "demo.localhost.:1", 200, "path=/x"},
		{"unknown app", "nope.localhost", 404, "no app named nope; push one with git push"},
		{"removed app", "removed.localhost", 404, "no app named removed"},
		{"known, not running", "sleepy.localhost", 503, "sleepy is not running"},
		{"backend dead", "gone.localhost", 502, "gone is not answering"},
		{"bare localhost", "localhost", 400, "<app>.localhost"},
		{"other domain", "demo.example.com", 400, ""},
		{"nested", "a.demo.localhost", 400, ""},
		{"bad label", "-x.localhost", 400, ""},
		{"hostile", "<script>.localhost", 400, ""},
		{"too long", strings.Repeat("a", 64) + ".localhost", 400, ""},
		{"ip", "127.0.0.1:80", 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
			req.Host = tt.host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.body) {
				t.Errorf("Host %q: %d %q, want %d containing %q", tt.host, resp.StatusCode, b, tt.code, tt.body)
			}
			if strings.Contains(string(b), "<script>") {
				t.Errorf("response echoes the hostile Host: %q", b)
			}
		})
	}
}

func TestAppFromHost(t *testing.T) {
	tests := []struct {
		host, app string
		ok        bool
	}{
		{"demo.localhost", "demo", true},
		{"my-app2.localhost:443", "my-app2", true},
		{"DEMO.LOCALHOST.", "demo", true},
		{"[::1]:80", "", false},
		{"demo.localhost:", "demo", true},
		{"demo-.localhost", "", false},
		{"1demo.localhost", "", false},
		{"de_mo.localhost", "", false},
		{"", "", false},
		{strings.Repeat("x", 400), "", false},
	}
	for _, tt := range tests {
		app, ok := AppFromHost(tt.host)
		if app != tt.app || ok != tt.ok {
			t.Errorf("AppFromHost(%q) = %q, %v; want %q, %v", tt.host, app, ok, tt.app, tt.ok)
		}
	}
}

func TestURL(t *testing.T) {
	if got, want := URL("demo", 8080), "http://demo.localhost:8080/"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
}
