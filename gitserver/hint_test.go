package gitserver

import "testing"

// TestHint: the hint comes from the public address when one is set, else from the listen
// address; -p is left out on port 22; a wildcard listen host says nothing to people and
// becomes HOST; IPv6 hosts are bare in the ssh command and bracketed in the remote URL.
func TestHint(t *testing.T) {
	for _, tc := range []struct {
		name           string
		public, listen string
		wantCmd        string // Command("apps:unlock", "demo")
		wantURL        string // RemoteURL("demo")
	}{
		{name: "public addr on port 22", public: "git.example.com:22", listen: ":2222",
			wantCmd: "ssh git@git.example.com apps:unlock demo", wantURL: "ssh://git@git.example.com/demo"},
		{name: "public addr on another port", public: "git.example.com:2022", listen: "127.0.0.1:2222",
			wantCmd: "ssh -p 2022 git@git.example.com apps:unlock demo", wantURL: "ssh://git@git.example.com:2022/demo"},
		{name: "public addr without a port", public: "git.example.com", listen: "127.0.0.1:2222",
			wantCmd: "ssh git@git.example.com apps:unlock demo", wantURL: "ssh://git@git.example.com/demo"},
		{name: "no public addr: the listener", listen: "127.0.0.1:2222",
			wantCmd: "ssh -p 2222 git@127.0.0.1 apps:unlock demo", wantURL: "ssh://git@127.0.0.1:2222/demo"},
		{name: "no public addr: listener on port 22", listen: "10.0.0.5:22",
			wantCmd: "ssh git@10.0.0.5 apps:unlock demo", wantURL: "ssh://git@10.0.0.5/demo"},
		{name: "wildcard listener without host", listen: ":2222",
			wantCmd: "ssh -p 2222 git@HOST apps:unlock demo", wantURL: "ssh://git@HOST:2222/demo"},
		{name: "wildcard listener 0.0.0.0", listen: "0.0.0.0:22",
			wantCmd: "ssh git@HOST apps:unlock demo", wantURL: "ssh://git@HOST/demo"},
		{name: "wildcard listener ::", listen: "[::]:2222",
			wantCmd: "ssh -p 2222 git@HOST apps:unlock demo", wantURL: "ssh://git@HOST:2222/demo"},
		{name: "IPv6 listener", listen: "[::1]:2222",
			wantCmd: "ssh -p 2222 git@::1 apps:unlock demo", wantURL: "ssh://git@[::1]:2222/demo"},
		{name: "IPv6 public addr on port 22", public: "[2001:db8::1]:22", listen: "[::]:2222",
			wantCmd: "ssh git@2001:db8::1 apps:unlock demo", wantURL: "ssh://git@[2001:db8::1]/demo"},
		{name: "nothing known",
			wantCmd: "ssh git@HOST apps:unlock demo", wantURL: "ssh://git@HOST/demo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHint(tc.public, tc.listen)
			if got := h.Command("apps:unlock", "demo"); got != tc.wantCmd {
				t.Errorf("NewHint(%q, %q).Command = %q, want %q", tc.public, tc.listen, got, tc.wantCmd)
			}
			if got := h.RemoteURL("demo"); got != tc.wantURL {
				t.Errorf("NewHint(%q, %q).RemoteURL = %q, want %q", tc.public, tc.listen, got, tc.wantURL)
			}
		})
	}
	if got, want := NewHint("", "127.0.0.1:2222").Command(), "ssh -p 2222 git@127.0.0.1"; got != want {
		t.Errorf("Command() = %q, want %q", got, want)
	}
}
