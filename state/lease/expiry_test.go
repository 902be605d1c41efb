package lease

import (
	"strings"
	"testing"
	"time"
)

func TestInfoExpired(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	held := Info{App: "demo", Holder: "a#1", Renewed: t0, TTL: 30 * time.Second}
	for _, tc := range []struct {
		name string
		info Info
		now  time.Time
		want bool
	}{
		{"just renewed", held, t0, false},
		{"within TTL", held, t0.Add(29*time.Second + 999*time.Millisecond), false},
		{"exactly at TTL", held, t0.Add(30 * time.Second), true},
		{"past TTL", held, t0.Add(time.Hour), true},
		{"clock behind the renewer", held, t0.Add(-time.Minute), false},
		{"released", Info{App: "demo", Renewed: t0, TTL: 30 * time.Second}, t0, true},
		{"never held", Info{App: "demo"}, t0, true},
		{"zero TTL", Info{App: "demo", Holder: "a#1", Renewed: t0}, t0, true},
		{"negative TTL", Info{App: "demo", Holder: "a#1", Renewed: t0, TTL: -time.Second}, t0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.info.Expired(tc.now); got != tc.want {
				t.Errorf("Expired(%v) of %+v = %v, want %v", tc.now, tc.info, got, tc.want)
			}
		})
	}
}

func TestInfoExpiresAt(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if got := (Info{Holder: "a", Renewed: t0, TTL: 2 * time.Second}).ExpiresAt(); !got.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("ExpiresAt = %v, want %v", got, t0.Add(2*time.Second))
	}
	if got := (Info{Renewed: t0, TTL: 2 * time.Second}).ExpiresAt(); !got.IsZero() {
		t.Errorf("ExpiresAt of a released lease = %v, want zero", got)
	}
}

func TestManagerDefaults(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      []Option
		kube      bool
		ttl, renw time.Duration
	}{
		{"defaults", nil, false, 30 * time.Second, 10 * time.Second},
		{"ttl sets renew", []Option{WithTTL(3 * time.Second)}, false, 3 * time.Second, time.Second},
		{"renew kept", []Option{WithTTL(3 * time.Second), WithRenewEvery(500 * time.Millisecond)}, false, 3 * time.Second, 500 * time.Millisecond},
		{"renew not below TTL", []Option{WithTTL(3 * time.Second), WithRenewEvery(3 * time.Second)}, false, 3 * time.Second, time.Second},
		{"local keeps sub-second TTL", []Option{WithTTL(300 * time.Millisecond)}, false, 300 * time.Millisecond, 100 * time.Millisecond},
		{"kube rounds TTL up to seconds", []Option{WithTTL(1500 * time.Millisecond)}, true, 2 * time.Second, 2 * time.Second / 3},
		{"kube at least 1 s", []Option{WithTTL(10 * time.Millisecond)}, true, time.Second, time.Second / 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *Manager
			if tc.kube {
				m = NewKube(nil, "ns", tc.opts...)
			} else {
				m = NewLocal(tc.opts...)
			}
			if m.ttl != tc.ttl || m.renew != tc.renw {
				t.Errorf("ttl %v renew %v, want %v and %v", m.ttl, m.renew, tc.ttl, tc.renw)
			}
		})
	}
}

func TestProcessIdentity(t *testing.T) {
	a, b := ProcessIdentity(), ProcessIdentity()
	if a == b {
		t.Errorf("two identities are equal (%q): a restarted process would inherit leases", a)
	}
	if parts := strings.Split(a, "_"); len(parts) < 3 {
		t.Errorf("identity %q is not <host>_<pid>_<random>", a)
	}
}
