package names

import (
	"strings"
	"testing"
)

func TestIsApp(t *testing.T) {
	for _, c := range []struct {
		s  string
		ok bool
	}{
		{"a", true}, {"my-app", true}, {"app2", true}, {strings.Repeat("a", 63), true},
		{"", false}, {strings.Repeat("a", 64), false}, {"2app", false}, {"-app", false}, {"app-", false},
		{"App", false}, {"my_app", false}, {"my.app", false}, {"../x", false}, {"a b", false}, {"ä", false},
	} {
		if got := IsApp(c.s); got != c.ok {
			t.Errorf("IsApp(%q) = %v, want %v", c.s, got, c.ok)
		}
	}
}

func TestIsEnv(t *testing.T) {
	for _, c := range []struct {
		s  string
		ok bool
	}{
		{"A", true}, {"_X", true}, {"GO_FLAGS2", true}, {"lower", true},
		{"", false}, {"1A", false}, {"A-B", false}, {"A.B", false}, {"A=B", false}, {"A B", false},
	} {
		if got := IsEnv(c.s); got != c.ok {
			t.Errorf("IsEnv(%q) = %v, want %v", c.s, got, c.ok)
		}
	}
}
