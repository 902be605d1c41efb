package commands

import (
	"bytes"
	"testing"
)

// TestRedact: values are replaced longest first, wherever they are, also when a write splits
// one; text without them is untouched.
func TestRedact(t *testing.T) {
	secrets := []string{"abcdef", "abcd"}
	for _, tc := range []struct {
		writes []string
		want   string
	}{
		{[]string{"x=abcdef y=abcd\n"}, "x=[hidden] y=[hidden]\n"},
		{[]string{"x=abc", "def\n", "tail abcd"}, "x=[hidden]\ntail [hidden]"},
		{[]string{"nothing here\n"}, "nothing here\n"},
		{[]string{"abcdabcdef"}, "[hidden][hidden]"},
		{[]string{""}, ""},
	} {
		var out bytes.Buffer
		w := &redactWriter{w: &out, secrets: secrets}
		for _, s := range tc.writes {
			if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
				t.Errorf("Write(%q) = %d, %v", s, n, err)
			}
		}
		w.Flush()
		if out.String() != tc.want {
			t.Errorf("writes %q gave %q, want %q", tc.writes, out.String(), tc.want)
		}
	}
	if got := redact("abc", nil); got != "abc" {
		t.Errorf("redact without secrets = %q", got)
	}
}
