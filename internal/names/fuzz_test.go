package names

import "testing"

// FuzzNames checks both rules against their definitions written out byte by byte, on any
// string: IsApp, which defers to Kubernetes' validation, against the DNS-1035 label, and
// IsEnv against the POSIX name (the regexp's $ must not match before a final newline, as it
// does in some engines).
func FuzzNames(f *testing.F) {
	for _, s := range []string{"", "a", "my-app", "a1", "1a", "-a", "a-", "A", "a_b", "a.b", "é", "a--b",
		"abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0", "a\n", "a\x00",
		"_", "PATH", "1A", "A-B", "A=B", "Ä", "A B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := IsApp(s), isDNS1035Label(s); got != want {
			t.Fatalf("IsApp(%q) = %v, but the DNS-1035 rule says %v", s, got, want)
		}
		if got, want := IsEnv(s), isPOSIXName(s); got != want {
			t.Fatalf("IsEnv(%q) = %v, but the POSIX name rule says %v", s, got, want)
		}
	})
}

// isDNS1035Label is RFC 1035's label as Kubernetes applies it: [a-z]([-a-z0-9]*[a-z0-9])?,
// at most 63 bytes.
func isDNS1035Label(s string) bool {
	if len(s) == 0 || len(s) > 63 || !(s[0] >= 'a' && s[0] <= 'z') || s[len(s)-1] == '-' {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// isPOSIXName is [A-Za-z_][A-Za-z0-9_]*.
func isPOSIXName(s string) bool {
	if len(s) == 0 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
