package gitserver

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestSplitCommandLine: a command line that splits like a shell's is split so; one whose
// quoting does not close is refused, never split some other way, with a command line that
// quotes the words for both shells.
func TestSplitCommandLine(t *testing.T) {
	const prefix = "ssh -p 2222 git@127.0.0.1"
	for _, c := range []struct {
		raw  string
		want []string
	}{
		{"apps:info demo --json", []string{"apps:info", "demo", "--json"}},
		{`config:set demo "A=hello world" B='x y'`, []string{"config:set", "demo", "A=hello world", "B=x y"}},
		{`config:set demo "A=it's"`, []string{"config:set", "demo", "A=it's"}},
		{`config:set demo A=a\ b`, []string{"config:set", "demo", "A=a b"}},
		{"  ", []string{}},
	} {
		got, err := splitCommandLine(c.raw, prefix)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("splitCommandLine(%q) = %q, %v; want %q", c.raw, got, err, c.want)
		}
	}
	for _, c := range []struct{ raw, why, hint string }{
		{"config:set demo KEY='unbalanced", "a ' quote is not closed", `"config:set demo \"KEY='unbalanced\""`},
		{"config:set demo KEY=it's", "a ' quote is not closed", `"config:set demo \"KEY=it's\""`},
		{`config:set demo "KEY=open`, `a " quote is not closed`, `"config:set demo KEY=open"`},
		{`config:set demo KEY=x\`, "ends in a backslash", `"config:set demo \"KEY=x\\\\\""`},
		{"config:set demo KEY=\xff", "not UTF-8", ""},
	} {
		got, err := splitCommandLine(c.raw, prefix)
		if err == nil || !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), "nothing was run") ||
			(c.hint != "" && !strings.Contains(err.Error(), prefix+" "+c.hint)) {
			t.Errorf("splitCommandLine(%q) = %q, %v; want refused: %q and the hint %s %s", c.raw, got, err, c.why, prefix, c.hint)
		}
	}
}

// TestQuoteForBothSurvivesBothShells: what quoteForBoth suggests, given to a real POSIX shell
// as the argument of ssh, reaches the server as a line that splits into the words that were
// typed, quotes and all.
func TestQuoteForBothSurvivesBothShells(t *testing.T) {
	for _, line := range []string{
		"config:set demo KEY=it's", "config:set demo KEY='unbalanced", `config:set demo KEY="open`,
		"config:set demo GREETING=it's me", `config:set demo "GREETING=hi  there`,
		`config:set demo KEY=back\slash`, "config:set demo KEY=$HOME`id`", `config:set demo A=x\`,
	} {
		// printf %s with the suggestion as its argument prints what ssh would send.
		sent, err := exec.Command("sh", "-c", "printf %s "+quoteForBoth(line)).Output()
		if err != nil {
			t.Fatalf("sh: %v", err)
		}
		got, err := splitCommandLine(string(sent), "ssh")
		if want := intendedWords(line); err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: the shell sends %q, which splits into %q, %v; want %q", line, sent, got, err, want)
		}
	}
}

func TestIntendedWordsKeepsTheValueWithAnOpenQuoteWhole(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"config:set demo GREETING=hi", []string{"config:set", "demo", "GREETING=hi"}},
		{"config:set demo GREETING=it's me", []string{"config:set", "demo", "GREETING=it's me"}},
		{`config:set demo "GREETING=hi  there`, []string{"config:set", "demo", "GREETING=hi  there"}},
		{`config:set demo GREETING="hi there  `, []string{"config:set", "demo", `GREETING="hi there`}},
		{"config:set demo A=1 B=it's", []string{"config:set", "demo", "A=1", "B=it's"}},
	} {
		if got := intendedWords(tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("intendedWords(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}
