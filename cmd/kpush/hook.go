package main

import (
	"os"

	"github.com/spf13/cobra"

	"kpush.dev/kpush/gitserver"
)

// hookCommand is what the bare repositories' hooks exec: `kpush hook pre-receive`. It calls
// back into the running server, which decides the push.
func hookCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "hook NAME",
		Short:  "Run a git hook inside a repository kpush serves (called by git, not by people)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(gitserver.RunHook(cmd.Context(), args[0], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
			return nil
		},
	}
}
