package gitserver

import (
	"testing"
	"time"
)

func TestGateAdmitsUnderBothLimits(t *testing.T) {
	type step struct {
		ip        string
		leave     int // >0: instead of entering, the step-th connection (1-based) leaves
		wantLimit string
	}
	for _, tc := range []struct {
		name            string
		total, perIP    int
		steps           []step
		wantWaitingLast int
	}{
		{"under both", 3, 2, []step{{ip: "a"}, {ip: "b"}, {ip: "a"}}, 3},
		{"per IP", 10, 2, []step{{ip: "a"}, {ip: "a"}, {ip: "a", wantLimit: limitPerIP}, {ip: "b"}}, 3},
		{"total", 2, 2, []step{{ip: "a"}, {ip: "b"}, {ip: "c", wantLimit: limitTotal}}, 2},
		{"total before per IP", 2, 1, []step{{ip: "a"}, {ip: "b"}, {ip: "a", wantLimit: limitTotal}}, 2},
		{"a leaver's place is free again", 10, 1, []step{{ip: "a"}, {ip: "a", wantLimit: limitPerIP}, {leave: 1}, {ip: "a"}}, 1},
		{"leaving twice frees one place", 3, 2, []step{{ip: "a"}, {ip: "a"}, {leave: 1}, {leave: 1}, {ip: "a"}, {ip: "a", wantLimit: limitPerIP}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(tc.total, tc.perIP)
			var conns []*guardedConn
			for i, s := range tc.steps {
				c := &guardedConn{ip: s.ip}
				conns = append(conns, c)
				if s.leave > 0 {
					g.leave(conns[s.leave-1])
					continue
				}
				limit, max := g.enter(c)
				if limit != s.wantLimit {
					t.Fatalf("step %d (%s): limit %q, want %q", i+1, s.ip, limit, s.wantLimit)
				}
				if limit == limitTotal && max != tc.total || limit == limitPerIP && max != tc.perIP {
					t.Errorf("step %d: max %d for limit %s", i+1, max, limit)
				}
			}
			if n := g.waiting(); n != tc.wantWaitingLast {
				t.Errorf("waiting %d, want %d", n, tc.wantWaitingLast)
			}
		})
	}
}

func TestSparseLogLetsOneLinePerIntervalAndCountsTheRest(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := sparseLog{every: 10 * time.Second}
	for i, tc := range []struct {
		at       time.Duration
		wantOK   bool
		wantHeld int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2},
		{11 * time.Second, false, 0},
		{time.Minute, true, 1},
		{time.Minute + 10*time.Second, true, 0},
	} {
		ok, held := l.allow(t0.Add(tc.at))
		if ok != tc.wantOK || held != tc.wantHeld {
			t.Errorf("line %d at +%s: allow = %v, %d; want %v, %d", i+1, tc.at, ok, held, tc.wantOK, tc.wantHeld)
		}
	}
}
