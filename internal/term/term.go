// Package term makes text safe to print on a person's terminal.
package term

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Sanitize returns s with every control character but tab shown escaped ("\x1b"), so no
// escape sequence, OSC or C1 control in text someone else wrote (an app's output, a failure
// reason) reaches a terminal: C0 controls, DEL, C1 controls (U+0080–U+009F) and bytes that
// are not UTF-8. Newlines are escaped too: Sanitize is for one line (a value printed as
// KEY=VALUE cannot start a line of its own). SanitizeText keeps them.
func Sanitize(s string) string { return sanitize(s, false) }

// SanitizeText is Sanitize for text of several lines: newlines stay, every other control
// character is shown escaped.
func SanitizeText(s string) string { return sanitize(s, true) }

func sanitize(s string, lines bool) string {
	if isClean(s, lines) {
		return s
	}
	var b strings.Builder
	escape(&b, s, lines)
	return b.String()
}

func allowed(r rune, lines bool) bool { return r == '\t' || (lines && r == '\n') }

// Printable reports whether s can be shown to a person as it is: UTF-8 with no control
// character but newline and tab, as SanitizeText leaves any text.
func Printable(s string) bool { return isClean(s, true) }

// isClean reports whether s is UTF-8 without a control character (but tab, and newline when
// lines), so that sanitizing it would change nothing.
func isClean(s string, lines bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if (r < 0x20 || (r >= 0x7f && r <= 0x9f)) && !allowed(r, lines) {
			return false
		}
	}
	return true
}

func escape(b *strings.Builder, s string, lines bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case allowed(r, lines):
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
}

// Writer passes what is written through SanitizeText to the writer it wraps: for output of
// several lines that arrives in pieces (a build log as it is replayed or followed). A
// character split between two writes is escaped whole; Flush writes what is held back of an
// incomplete one at the end.
type Writer struct {
	w    io.Writer
	tail []byte // the start of a UTF-8 sequence the next write may complete
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

func (t *Writer) Write(p []byte) (int, error) {
	buf := append(t.tail, p...)
	cut := len(buf)
	// Hold back an incomplete UTF-8 sequence at the end (at most 3 bytes).
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	t.tail = append([]byte(nil), buf[cut:]...)
	if cut > 0 {
		if _, err := io.WriteString(t.w, SanitizeText(string(buf[:cut]))); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes, escaped, the incomplete character held back at the end, if any.
func (t *Writer) Flush() error {
	if len(t.tail) == 0 {
		return nil
	}
	_, err := io.WriteString(t.w, SanitizeText(string(t.tail)))
	t.tail = nil
	return err
}
