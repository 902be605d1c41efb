package gitserver

import (
	"net"
	"strings"
)

// Hint is how people reach the SSH server, for the commands and remotes kpush suggests in
// its messages: "ssh -p 2222 git@127.0.0.1 apps:unlock demo", "ssh git@git.example.com help"
// on port 22. Every message that tells people what to run is built from one Hint, so they
// all agree.
type Hint struct {
	Host string // "HOST" when nothing better is known
	Port string // "22" when none was given
}

// NewHint is the hint for a server people reach at publicAddr (host:port, --public-addr)
// or, when that is empty, at listenAddr (the SSH listener's address, or a connection's local
// address, which is the best known host). A host that says nothing to people (empty,
// 0.0.0.0, ::) becomes "HOST"; an address without a port means port 22.
func NewHint(publicAddr, listenAddr string) Hint {
	addr := publicAddr
	if addr == "" {
		addr = listenAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = strings.Trim(addr, "[]"), ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "HOST"
	}
	if port == "" {
		port = "22"
	}
	return Hint{Host: host, Port: port}
}

// Command is the ssh command line that runs args on the server: "ssh -p 2222 git@127.0.0.1
// apps:unlock demo", without -p on port 22. Without args it is the prefix people add a
// command to. An IPv6 host is written bare ("git@::1"), the form ssh takes.
func (h Hint) Command(args ...string) string {
	cmd := "ssh git@" + h.Host
	if h.Port != "22" {
		cmd = "ssh -p " + h.Port + " git@" + h.Host
	}
	if len(args) > 0 {
		cmd += " " + strings.Join(args, " ")
	}
	return cmd
}

// RemoteURL is the git remote of app: "ssh://git@127.0.0.1:2222/demo",
// "ssh://git@[::1]/demo" on port 22.
func (h Hint) RemoteURL(app string) string {
	if h.Port == "22" {
		host := h.Host
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		return "ssh://git@" + host + "/" + app
	}
	return "ssh://git@" + net.JoinHostPort(h.Host, h.Port) + "/" + app
}

// Addr is the hint's "host:port", e.g. for gitserver.Command.Addr.
func (h Hint) Addr() string { return net.JoinHostPort(h.Host, h.Port) }
