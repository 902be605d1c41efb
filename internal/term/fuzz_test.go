package term

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// FuzzSanitize checks the promise of Sanitize, SanitizeText and Writer on any string. What
// Sanitize and SanitizeText return is valid UTF-8 with no control character but tab (and
// newline, for SanitizeText): no C0, DEL or C1 control; a string that has none comes back
// unchanged; sanitizing twice changes nothing more; and they work rune by rune, so sanitizing
// the two halves of a string cut at a rune start gives the same as sanitizing the whole (no
// escape depends on its neighbours). A Writer's output, however the string is cut into writes
// (sizes gives the length of each, cycling; a cut may split a character), is SanitizeText of
// the whole once flushed, and every write reports all of its bytes written.
func FuzzSanitize(f *testing.F) {
	for _, s := range []string{
		"", "plain", "tab\there", "two\nlines", "ünïcödé ✓", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07",
		"c1 \u009b31m", "bad \xff byte", "\x00\x7f\r\n", `already \x1b escaped`, "\xe2\x82", "\u2028\ufeff",
		"ü\xc2\x9b\x1b[31mé中😀", "😀😀😀", "a\xf0\x9f\x98", "\xf0\x9f\x98\x80\x80\x80",
	} {
		f.Add(s, []byte{byte(len(s) / 2), 1, 2, 3})
	}
	f.Fuzz(func(t *testing.T, s string, sizes []byte) {
		for _, fn := range []struct {
			name     string
			sanitize func(string) string
			newline  bool // newlines stay
		}{{"Sanitize", Sanitize, false}, {"SanitizeText", SanitizeText, true}} {
			got := fn.sanitize(s)
			if !utf8.ValidString(got) {
				t.Fatalf("%s(%q) = %q: not UTF-8", fn.name, s, got)
			}
			for _, r := range got {
				if isControl(r, fn.newline) {
					t.Fatalf("%s(%q) = %q: keeps control character %U", fn.name, s, got, r)
				}
			}
			if clean(s, fn.newline) && got != s {
				t.Fatalf("%s(%q) = %q: changed a string without control characters", fn.name, s, got)
			}
			if again := fn.sanitize(got); again != got {
				t.Fatalf("%s(%s(%q)) = %q, want %q: not idempotent", fn.name, fn.name, s, again, got)
			}
			i := 0
			if len(sizes) > 0 {
				i = int(sizes[0]) % (len(s) + 1)
			}
			for i < len(s) && !utf8.RuneStart(s[i]) {
				i++
			}
			if parts := fn.sanitize(s[:i]) + fn.sanitize(s[i:]); parts != got {
				t.Fatalf("%s(%q)+%s(%q) = %q, but %s of both = %q", fn.name, s[:i], fn.name, s[i:], parts, fn.name, got)
			}
		}

		var out bytes.Buffer
		w := NewWriter(&out)
		for i, k := 0, 0; i < len(s); k++ {
			n := 1
			if len(sizes) > 0 {
				n = int(sizes[k%len(sizes)])
			}
			n = min(max(n, 1), len(s)-i)
			if m, err := w.Write([]byte(s[i : i+n])); m != n || err != nil {
				t.Fatalf("Write(%q) = %d, %v", s[i:i+n], m, err)
			}
			i += n
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if want := SanitizeText(s); out.String() != want {
			t.Fatalf("Writer on %q in writes of %v wrote %q, want %q", s, sizes, out.String(), want)
		}
	})
}

// isControl reports whether r is what Sanitize must not let through: C0 controls but tab (and
// newline when newline is set), DEL and C1 controls. (Bytes that are not UTF-8 are caught by
// utf8.ValidString; a real U+FFFD is text.)
func isControl(r rune, newline bool) bool {
	if r == '\t' || (newline && r == '\n') {
		return false
	}
	return r < 0x20 || (r >= 0x7f && r <= 0x9f)
}

func clean(s string, newline bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if isControl(r, newline) {
			return false
		}
	}
	return true
}
