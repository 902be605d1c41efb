package receiver

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestProgressSpeaksOnlyInSilenceAndAtLineStarts drives the progress writer's clock by hand:
// each step writes output or ticks at a time, and the whole output is compared.
func TestProgressSpeaksOnlyInSilenceAndAtLineStarts(t *testing.T) {
	type step struct {
		at    time.Duration // since the writer started
		write string        // written by the build; empty: a tick
		phase string        // Phase called before the step
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  string
	}{
		{"silence after a line", []step{{at: 1 * time.Second, write: "a\n"}, {at: 16 * time.Second}, {at: 31 * time.Second}},
			"a\n-----> still building (16s)\n-----> still building (31s)\n"},
		{"a tick before the quiet interval ended is silent", []step{{at: 14 * time.Second}},
			""},
		{"chatter keeps it silent", []step{{at: 10 * time.Second, write: "a\n"}, {at: 15 * time.Second}, {at: 20 * time.Second, write: "b\n"},
			{at: 30 * time.Second}, {at: 34 * time.Second, write: "c\n"}, {at: 45 * time.Second}},
			"a\nb\nc\n"},
		{"nothing written at all", []step{{at: 15 * time.Second}},
			"-----> still building (15s)\n"},
		{"minutes", []step{{at: 80 * time.Second}},
			"-----> still building (1m20s)\n"},
		{"a silent half line is ended, and its rest indented", []step{{at: 1 * time.Second, write: "       downloading"}, {at: 16 * time.Second},
			{at: 17 * time.Second, write: " done\n"}, {at: 18 * time.Second, write: "       next\n"}},
			"       downloading\n-----> still building (16s)\n        done\n       next\n"},
		{"the newline that ends a half line we ended is not repeated", []step{{at: 1 * time.Second, write: "x"}, {at: 16 * time.Second},
			{at: 17 * time.Second, write: "\ny\n"}},
			"x\n-----> still building (16s)\ny\n"},
		{"deploying counts from its phase", []step{{at: 5 * time.Second, write: "built\n"}, {at: 100 * time.Second, write: "-----> Deploying\n", phase: "deploying"},
			{at: 140 * time.Second}},
			"built\n-----> Deploying\n-----> still deploying (40s)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clk := &fakeClock{t: start}
			p := stoppedProgress(&out, "building", 15*time.Second, clk.now)
			for _, s := range tc.steps {
				clk.t = start.Add(s.at)
				if s.phase != "" {
					p.Phase(s.phase)
				}
				if s.write == "" {
					p.tick(clk.t)
					continue
				}
				if n, err := p.Write([]byte(s.write)); n != len(s.write) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s.write, n, err)
				}
			}
			if out.String() != tc.want {
				t.Errorf("output\n%q\nwant\n%q", out.String(), tc.want)
			}
		})
	}
}

// TestProgressWritesWhileSilentAndStops runs the real timer with a short interval: lines
// come while nothing is written, writers writing concurrently never have a line cut by one,
// and Stop returns once its goroutine has ended (run under -race).
func TestProgressWritesWhileSilentAndStops(t *testing.T) {
	var out syncBuffer
	p := newProgress(&out, "building", 20*time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				p.Write([]byte("       chatter"))
				time.Sleep(time.Millisecond)
				p.Write([]byte(" line\n"))
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), "still building") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no 3 progress lines within 10s of silence:\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Stop()
	p.Stop() // twice is fine
	got := out.String()
	for _, l := range strings.SplitAfter(got, "\n") {
		if i := strings.Index(l, "-----> still"); i > 0 {
			t.Fatalf("progress line in the middle of a line: %q", l)
		}
	}
	select {
	case <-p.done:
	default:
		t.Fatal("the progress goroutine is still running after Stop")
	}
}
