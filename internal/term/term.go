// Package term makes text safe to print on a person's terminal.
package term

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Sanitize returns s with every control character but tab shown escaped ("\x1b"), so no
// escape sequence, OSC or C1 control in text someone else wrote (an app's output, a failure
// reason) reaches a terminal: C0 controls, DEL, C1 controls (U+0080–U+009F) and bytes that
// are not UTF-8. Newlines are escaped too: Sanitize is for one line.
func Sanitize(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || (r < 0x20 && r != '\t') || (r >= 0x7f && r <= 0x9f) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case (r < 0x20 && r != '\t') || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
