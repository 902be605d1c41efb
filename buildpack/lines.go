package buildpack

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"

	"kpush.dev/kpush/internal/term"
)

// maxLine is the longest line kept in memory; longer ones are written out in pieces.
const maxLine = 64 << 10

// escapes matches terminal escape sequences: CSI (colours, cursor movement), OSC (titles,
// links) and two-byte ESC sequences.
var escapes = regexp.MustCompile(`\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])`)

// cleanLine removes terminal escapes (colours, titles) and the C0 controls and DEL other than
// tab, and shows C1 controls (U+0080–U+009F; U+009B is a one-character CSI) escaped, as
// term.Sanitize does: what is left is printable, and a line without any comes back as it was.
func cleanLine(b []byte) string {
	b = escapes.ReplaceAll(b, nil)
	return term.Sanitize(strings.Map(func(r rune) rune {
		if r == '\t' || r >= 0x20 && r != 0x7f {
			return r
		}
		return -1
	}, string(b)))
}

// lineSink writes whole, cleaned lines to out for any number of lineWriters, so that a
// process's stdout and stderr interleave by line, never mid-line. It remembers the last line
// starting with "ERROR: " (the lifecycle's failure summary). Write errors of out (e.g. the
// pusher hung up) are remembered and never returned to the process, so the build finishes
// or fails on its own terms.
type lineSink struct {
	mu  sync.Mutex
	out io.Writer
	// freshImage is the build's output image (the fresh unique tag). Without a previous
	// image the analyzer looks for it, and its `Image with name "<freshImage>" not found`
	// line, which reads like an error, is replaced by noPrevious if that is set (see
	// previousImage).
	freshImage, noPrevious string
	lastErr                string
	werr                   error
}

func (s *lineSink) emit(line []byte) {
	l := cleanLine(line)
	if s.noPrevious != "" && strings.TrimSpace(l) == fmt.Sprintf(analyzerNotFoundLine, s.freshImage) {
		l = s.noPrevious
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rest, ok := strings.CutPrefix(l, "ERROR: "); ok {
		s.lastErr = strings.TrimSpace(rest)
	}
	if s.werr == nil {
		_, s.werr = io.WriteString(s.out, l+"\n")
	}
}

// lastError returns the last "ERROR: " line's text.
func (s *lineSink) lastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// lineWriter splits one stream into lines at "\n", "\r\n" or a lone "\r" (progress output)
// and hands them to its sink. Call Flush after the stream ends.
type lineWriter struct {
	sink *lineSink
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			break
		}
		next := i + 1
		if w.buf[i] == '\r' {
			if next == len(w.buf) {
				break // "\r" at the end: wait to see whether "\n" follows
			}
			if w.buf[next] == '\n' {
				next++
			}
		}
		if i > 0 || w.buf[i] == '\n' || next-i == 2 {
			w.sink.emit(w.buf[:i])
		}
		w.buf = w.buf[next:]
	}
	for len(w.buf) > maxLine {
		w.sink.emit(w.buf[:maxLine])
		w.buf = w.buf[maxLine:]
	}
	if len(w.buf) == 0 {
		w.buf = nil // let the backing array go
	}
	return len(p), nil
}

// Flush writes a last unterminated line, if any.
func (w *lineWriter) Flush() {
	b := bytes.TrimRight(w.buf, "\r")
	if len(b) > 0 {
		w.sink.emit(b)
	}
	w.buf = nil
}
