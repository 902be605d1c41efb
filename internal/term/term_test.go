package term

import "testing"

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
