package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"kpush.dev/kpush/buildpack"
)

// sourceCommand holds what build Pods run from kpush's own image, so the builder image needs
// no git or curl: `kpush source fetch` (init container) and `kpush source complete` (main
// container).
func sourceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "source",
		Short:  "Fetch a pushed source tree inside a build Pod (run by build Pods, not by people)",
		Hidden: true,
	}
	var o buildpack.SourceFetchOptions
	fetch := &cobra.Command{
		Use:   "fetch --url URL --dest DIR [--token-file FILE] [--platform DIR]",
		Short: "Download the build source from kpush with a single-use token and extract it",
		Long: "Downloads the build source from kpush's source endpoint with a single-use token (from\n" +
			"--token-file, else $" + buildpack.SourceTokenEnv + ") and extracts it into --dest. With --platform,\n" +
			"writes the build environment from $" + buildpack.PlatformEnvEnv + " (JSON) to DIR/env/NAME.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return buildpack.RunSourceFetch(cmd.Context(), o, os.Getenv, cmd.OutOrStdout())
		},
	}
	f := fetch.Flags()
	f.StringVar(&o.URL, "url", "", "kpush's source endpoint")
	f.StringVar(&o.TokenFile, "token-file", "", "file holding the source token (default: $"+buildpack.SourceTokenEnv+")")
	f.StringVar(&o.Dest, "dest", "/workspace", "directory to extract the source into")
	f.StringVar(&o.Platform, "platform", "", "CNB platform directory to write env/NAME files into")
	complete := &cobra.Command{
		Use:   "complete",
		Short: "Exit at once: the build Pod's main container, after the lifecycle phases",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "build complete")
			return nil
		},
	}
	cmd.AddCommand(fetch, complete)
	return cmd
}
