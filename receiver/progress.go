package receiver

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progressQuiet is how long a build or deploy may print nothing before kpush says it is
// still at it. Under 20 s: the pusher sees the push is alive, and the SSH connection carries
// data often enough for load balancers that drop idle connections (AWS NLB after 350 s,
// many HTTP-aware proxies after 60 s).
const progressQuiet = 15 * time.Second

// progress is a writer for a build's output that notices silence: when nothing was written
// for quiet, it writes "-----> still PHASE (ELAPSED)" itself, and again every quiet while
// the silence lasts. Its lines start at the beginning of a line: after a write that ended
// mid-line, the line is first ended, and the output that continues it is indented as
// builder output is (indent), so neither is cut in two. Writes are serialized with its own,
// so the writer it wraps sees one writer. Stop ends it.
type progress struct {
	quiet time.Duration
	now   func() time.Time // time.Now; tests' clocks

	mu    sync.Mutex
	w     io.Writer
	phase string
	since time.Time // the phase's start
	last  time.Time // the last write, ours or the wrapped one's
	bol   bool      // the last byte written was a newline (or nothing was written)
	broke bool      // we ended a line the output had left open

	stop, done chan struct{}
	once       sync.Once
}

// newProgress starts a progress writer over w for phase ("building") with the interval quiet.
func newProgress(w io.Writer, phase string, quiet time.Duration) *progress {
	p := stoppedProgress(w, phase, quiet, time.Now)
	go p.run()
	return p
}

// stoppedProgress is a progress writer whose ticks are left to the caller (tick); it has no
// goroutine, so Stop would wait forever.
func stoppedProgress(w io.Writer, phase string, quiet time.Duration, now func() time.Time) *progress {
	t := now()
	return &progress{quiet: quiet, now: now, w: w, phase: phase, since: t, last: t, bol: true,
		stop: make(chan struct{}), done: make(chan struct{})}
}

func (p *progress) run() {
	defer close(p.done)
	t := time.NewTimer(p.quiet)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			t.Reset(p.tick(p.now()))
		}
	}
}

// tick writes the progress line when the output has been silent for quiet at now, and
// returns how long to wait before looking again.
func (p *progress) tick(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if silent := now.Sub(p.last); silent < p.quiet {
		return p.quiet - silent
	}
	line := fmt.Sprintf("-----> still %s (%s)\n", p.phase, now.Sub(p.since).Round(time.Second))
	if !p.bol {
		line = "\n" + line
		p.broke = true
	}
	// A failing writer (the pusher went away) is the wrapped writer's business: the tee
	// keeps the build log going, and the next tick tries again.
	p.w.Write([]byte(line))
	p.bol, p.last = true, now
	return p.quiet
}

// Phase names what the silence is spent on from now on ("deploying") and restarts its clock.
func (p *progress) Phase(phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.since = phase, p.now()
}

func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b) == 0 {
		return 0, nil
	}
	n, extra := len(b), 0
	if p.broke {
		// The rest of the line we ended: its newline is already written, and anything else
		// goes on a line of its own.
		p.broke = false
		if b[0] == '\n' {
			b, extra = b[1:], -1
		} else {
			b, extra = append(pad[:len(pad):len(pad)], b...), len(pad)
		}
	}
	p.last = p.now()
	if len(b) == 0 {
		return n, nil
	}
	m, err := p.w.Write(b)
	if m > 0 {
		p.bol = b[m-1] == '\n'
	}
	if err != nil {
		return max(0, min(n, m-extra)), err
	}
	return n, nil
}

// Stop ends the progress lines and waits until none can be written; it may be called more
// than once.
func (p *progress) Stop() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}

var _ io.Writer = (*progress)(nil)
