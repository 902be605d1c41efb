package term

import (
	"strings"
	"testing"
)

func TestSanitize(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\twith a tab", "plain text\twith a tab"},
		{"ünïcödé ✓", "ünïcödé ✓"},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"\x1b]0;PWNED\x07title", `\x1b]0;PWNED\x07title`},
		{"\x1b]52;c;Zm9v\x07clipboard", `\x1b]52;c;Zm9v\x07clipboard`},
		{"c1 \u009b31m csi", `c1 \u009b31m csi`},
		{"bad \xff byte", `bad \xff byte`},
		{"nul\x00 del\x7f cr\r nl\n", `nul\x00 del\x7f cr\x0d nl\x0a`},
	} {
		if got := Sanitize(c.in); got != c.want {
			t.Errorf("Sanitize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSanitizeTextKeepsNewlinesAndTabsOnly(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"two\nlines\tand a tab\n", "two\nlines\tand a tab\n"},
		{"\x1b[2J\x1b[Hcleared\n", `\x1b[2J\x1b[Hcleared` + "\n"},
		{"progress\r100%\n", `progress\x0d100%` + "\n"},
		{"osc \x1b]8;;http://x\x1b\\link\n", `osc \x1b]8;;http://x\x1b\link` + "\n"},
		{"c1 \u0090 dcs \u009d osc\n", `c1 \u0090 dcs \u009d osc` + "\n"},
		{"ünïcödé ✓\n", "ünïcödé ✓\n"},
	} {
		if got := SanitizeText(c.in); got != c.want {
			t.Errorf("SanitizeText(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A Writer gives what SanitizeText gives for the whole text, however it is cut into writes:
// a C1 control or a letter split between two writes is recognised whole.
func TestWriterSanitizesAcrossWrites(t *testing.T) {
	in := "a\u009bb ✓\x1b[31m\nünï\xffz\xe2\x9c"
	want := SanitizeText(in)
	for size := 1; size <= len(in); size++ {
		var out strings.Builder
		w := NewWriter(&out)
		for i := 0; i < len(in); i += size {
			w.Write([]byte(in[i:min(i+size, len(in))]))
		}
		w.Flush()
		if out.String() != want {
			t.Errorf("writes of %d bytes: %q, want %q", size, out.String(), want)
		}
	}
}
