package commands

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"kpush.dev/kpush/receiver"
)

// help is `help [COMMAND]`: cobra's own prints "Unknown help topic" and exits 0.
func (inv *invocation) help() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Show the list of commands, or help for one",
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			target, rest, err := root.Find(args)
			if err != nil || target == nil || len(rest) > 0 || (len(args) > 0 && target == root) {
				inv.ran = false // a usage error: RunCommand adds the hint to run help
				return fmt.Errorf("help: unknown command %q", strings.Join(args, " "))
			}
			target.InitDefaultHelpFlag()
			return target.Help()
		},
	}
}

// remoteURL is the git remote of app on the server the client reached at addr (host:port):
// "ssh://git@127.0.0.1:2222/demo", with HOST for an unknown address.
func remoteURL(addr, app string) string { return receiver.RemoteURL(addr, app) }
