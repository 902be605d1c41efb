package gitserver

import (
	"context"
	"io"
)

// Command is one non-git SSH exec request, e.g. `ssh git@host apps:info demo --json`.
type Command struct {
	User string   // the authenticated, registered user
	Args []string // the command line split the way a POSIX shell would (gliderlabs' Session.Command)
	// Addr is the "host:port" the client connected to (WithPublicAddr when set, else the
	// connection's local address), for messages such as the remote URL of a new app.
	Addr   string
	Stdin  io.Reader // the client's stdin (e.g. a public key for keys:add)
	Stdout io.Writer // output for people (or JSON); "\n" becomes "\r\n" when the client asked for a PTY
	Stderr io.Writer // errors for people; translated like Stdout
}

// CommandHandler runs SSH commands that are not git services. It returns the exit status
// sent to the client; ctx ends when the client disconnects.
type CommandHandler interface {
	RunCommand(ctx context.Context, c *Command) int
}

// CommandHandlerFunc adapts a function to CommandHandler.
type CommandHandlerFunc func(ctx context.Context, c *Command) int

// RunCommand calls f(ctx, c).
func (f CommandHandlerFunc) RunCommand(ctx context.Context, c *Command) int { return f(ctx, c) }
