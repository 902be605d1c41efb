package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer/knative"
	"kpush.dev/kpush/receiver"
	"kpush.dev/kpush/receiver/lease"
)

// serveCommand is `kpush serve`: cluster mode, deploying Knative Services.
func serveCommand() *cobra.Command {
	var (
		c            gitConfig
		kubeconfig   string
		namespace    string
		registry     string
		runImage     string
		readyTimeout time.Duration
		buildpacks   []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run kpush against a Kubernetes cluster with Knative Serving",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := newLogger(true, slog.LevelInfo)
			err := c.validate()
			if registry == "" {
				err = errors.Join(err, errors.New("--registry is empty: give the repository prefix app images go to, e.g. registry.example.com/kpush (env KPUSH_REGISTRY)"))
			}
			if namespace == "" {
				err = errors.Join(err, errors.New("--namespace is empty: set KPUSH_NAMESPACE, e.g. from the pod's metadata.namespace"))
			}
			if err != nil {
				return err
			}
			// Empty kubeconfig means the in-cluster config (client-go's rules).
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("loading Kubernetes client config: %w", err)
			}
			cs, err := servingclientset.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("building Knative Serving client: %w", err)
			}
			kcs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("building Kubernetes client: %w", err)
			}
			d := knative.New(cs, namespace, knative.WithReadyTimeout(readyTimeout), knative.WithLogger(log))
			builder := &buildpack.Local{DataDir: c.DataDir, RunImage: runImage, Log: log}
			if len(buildpacks) > 0 {
				if builder.ExtraBuildpacks, builder.Order, err = extraBuildpacks(buildpacks); err != nil {
					return err
				}
			}
			p := &receiver.Pipeline{
				Builder:  builder,
				Deployer: d,
				// One coordination.k8s.io Lease per app, shared by every replica.
				Leases:   lease.NewKube(kcs.CoordinationV1(), namespace, lease.WithTTL(c.LeaseTTL), lease.WithLogger(log)),
				Registry: registry,
				WorkDir:  filepath.Join(c.DataDir, "tmp"),
				Log:      log,
			}
			if err := os.MkdirAll(p.WorkDir, 0o700); err != nil {
				return err
			}
			return serveGit(ctx, c, p, log, 2*time.Minute)
		},
	}
	c.flags(cmd.Flags(), "/var/lib/kpush", ":2222")
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: in-cluster config; env KUBECONFIG)")
	fs.StringVar(&namespace, "namespace", envOr("NAMESPACE", "default"), "namespace of the Knative Services (env KPUSH_NAMESPACE)")
	fs.StringVar(&registry, "registry", envOr("REGISTRY", ""), "repository prefix for app images: REGISTRY/APP (env KPUSH_REGISTRY)")
	fs.StringVar(&runImage, "run-image", envOr("RUN_IMAGE", ""), "CNB run image by digest (default: kpush's own, generated into the registry; env KPUSH_RUN_IMAGE)")
	readyDefault := 5 * time.Minute
	if v := os.Getenv("KPUSH_READY_TIMEOUT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			readyDefault = d
		}
	}
	fs.StringArrayVar(&buildpacks, "buildpack", nil, "directory of an extra buildpack (buildpack.toml, bin/detect, bin/build), run as optional in front of every group of the default order; repeatable")
	fs.DurationVar(&readyTimeout, "ready-timeout", readyDefault, "how long a deploy waits for the Service to become Ready (env KPUSH_READY_TIMEOUT)")
	return cmd
}
