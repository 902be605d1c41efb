package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	servingclientset "knative.dev/serving/pkg/client/clientset/versioned"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer/knative"
	"kpush.dev/kpush/internal/ops"
	"kpush.dev/kpush/receiver"
	"kpush.dev/kpush/state/lease"
)

// serveCommand is `kpush serve`: cluster mode, deploying Knative Services.
func serveCommand() *cobra.Command {
	var (
		c            gitConfig
		b            buildConfig
		kubeconfig   string
		namespace    string
		registry     string
		runImage     string
		readyTimeout time.Duration
		buildpacks   []string
		logc         logConfig
		opsAddr      *string
	)
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Run kpush against a Kubernetes cluster with Knative Serving",
		Args:    cobra.NoArgs,
		PreRunE: envPreRun,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log, err := logc.logger(os.Stderr)
			if err != nil {
				return err
			}
			err = errors.Join(c.validate(), b.validate(kubeconfig))
			if registry == "" {
				err = errors.Join(err, errors.New("--registry is empty: give the repository prefix app images go to, e.g. registry.example.com/kpush (env KPUSH_REGISTRY)"))
			}
			if namespace == "" {
				err = errors.Join(err, errors.New("--namespace is empty: set KPUSH_NAMESPACE, e.g. from the pod's metadata.namespace"))
			}
			if err != nil {
				return err
			}
			rc, err := registryCheck(registry)
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
			m, inflight := ops.NewMetrics(), &ops.Tracker{}
			shutdownOps, err := startOps(ctx, *opsAddr, log, m, ops.DialCheck("ssh", c.SSHAddr), rc, kubeCheck(kcs.Discovery()))
			if err != nil {
				return err
			}
			defer stopOps(shutdownOps, log)

			d := knative.New(cs, namespace, knative.WithReadyTimeout(readyTimeout), knative.WithLogger(log))
			var builder receiver.Builder
			switch b.kind(kubeconfig) {
			case builderKube:
				if len(buildpacks) > 0 {
					return errors.New("--buildpack works only with --builder local: build Pods run the builder image's buildpacks")
				}
				k, stopSources, err := b.kube(kcs, namespace, registry, runImage, log)
				if err != nil {
					return err
				}
				defer stopSources()
				builder = k
			default:
				if err := checkSandbox(ctx, c.DataDir, log); err != nil {
					return err
				}
				l := &buildpack.Local{DataDir: c.DataDir, RunImage: runImage, Log: log}
				if len(buildpacks) > 0 {
					if l.ExtraBuildpacks, l.Order, err = extraBuildpacks(buildpacks); err != nil {
						return err
					}
				}
				builder = l
			}
			p := &receiver.Pipeline{
				Builder:  builder,
				Deployer: d,
				// One coordination.k8s.io Lease per app, shared by every replica.
				Leases:   lease.NewKube(kcs.CoordinationV1(), namespace, lease.WithTTL(c.LeaseTTL), lease.WithLogger(log)),
				Registry: registry,
				WorkDir:  filepath.Join(c.DataDir, "tmp"),
				Log:      log,
				Metrics:  m,
				Inflight: inflight,
			}
			if err := os.MkdirAll(p.WorkDir, 0o700); err != nil {
				return err
			}
			return serveGit(ctx, c, p, log, nil)
		},
	}
	fs := cmd.Flags()
	c.flags(fs, "/var/lib/kpush", ":2222", 2*time.Minute)
	b.flags(fs)
	logc.flags(fs, "json")
	opsAddr = opsFlags(fs, ":8081")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config; env KUBECONFIG)")
	fs.StringVar(&namespace, "namespace", "default", "namespace of the Knative Services (env KPUSH_NAMESPACE)")
	fs.StringVar(&registry, "registry", "", "repository prefix for app images: REGISTRY/APP; required (env KPUSH_REGISTRY)")
	fs.StringVar(&runImage, "run-image", "", "CNB run image by digest (default: local builds generate kpush's own into the registry, build Pods use the builder's; env KPUSH_RUN_IMAGE)")
	fs.StringArrayVar(&buildpacks, "buildpack", nil, "directory of an extra buildpack (buildpack.toml, bin/detect, bin/build), run as optional in front of every group of the default order; repeatable; --builder local only")
	fs.DurationVar(&readyTimeout, "ready-timeout", 5*time.Minute, "how long a deploy waits for the Service to become Ready (env KPUSH_READY_TIMEOUT)")
	bindEnv(fs, map[string]string{"kubeconfig": "KUBECONFIG", "namespace": "KPUSH_NAMESPACE", "registry": "KPUSH_REGISTRY",
		"run-image": "KPUSH_RUN_IMAGE", "ready-timeout": "KPUSH_READY_TIMEOUT"})
	return cmd
}

// Builders of `kpush serve --builder`.
const (
	builderLocal = "local" // the CNB lifecycle in kpush's own container, under bubblewrap
	builderKube  = "kube"  // one build Pod per build (buildpack.Kube)
)

// buildConfig is how `kpush serve` builds: in its own container or in build Pods.
type buildConfig struct {
	Builder        string // builderLocal, builderKube or "" (auto)
	BuilderImage   string
	KpushImage     string
	Namespace      string
	RegistrySecret string
	Resources      string // JSON corev1.ResourceRequirements
	User           string // UID:GID
	SourceAddr     string
	SourceURL      string
}

func (b *buildConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&b.Builder, "builder", "", "where builds run: kube (a build Pod per build) or local (the lifecycle inside kpush's container, under bubblewrap); default kube in a cluster (no --kubeconfig), else local (env KPUSH_BUILDER)")
	fs.StringVar(&b.BuilderImage, "builder-image", "", "CNB builder image of build Pods (default "+buildpack.DefaultBuilderImage+"; env KPUSH_BUILDER_IMAGE)")
	fs.StringVar(&b.KpushImage, "kpush-image", "", "kpush's own image, whose 'kpush source fetch' build Pods run to fetch the source; required with --builder kube (env KPUSH_IMAGE)")
	fs.StringVar(&b.Namespace, "build-namespace", "", "namespace of build Pods (default: --namespace; env KPUSH_BUILD_NAMESPACE)")
	fs.StringVar(&b.RegistrySecret, "registry-secret", "", "kubernetes.io/dockerconfigjson Secret in the build namespace with push access to --registry, mounted into the phases that need it (default: anonymous; env KPUSH_REGISTRY_SECRET)")
	fs.StringVar(&b.Resources, "builder-resources", "", `resources of each build Pod container as JSON, e.g. {"requests":{"cpu":"1","memory":"2Gi"},"limits":{"memory":"4Gi"}} (env KPUSH_BUILDER_RESOURCES)`)
	fs.StringVar(&b.User, "builder-user", "", "UID:GID the builder image's CNB user has (default 1001:1000 for the default builder image, else 1000:1000; env KPUSH_BUILDER_USER)")
	fs.StringVar(&b.SourceAddr, "source-addr", ":8082", "address build Pods fetch sources from (single-use tokens); --builder kube only (env KPUSH_SOURCE_ADDR)")
	fs.StringVar(&b.SourceURL, "source-url", "", "URL build Pods reach --source-addr at, e.g. http://kpush.NAMESPACE.svc:8082/source; required with --builder kube (env KPUSH_SOURCE_URL)")
	bindEnv(fs, map[string]string{"builder": "KPUSH_BUILDER", "builder-image": "KPUSH_BUILDER_IMAGE", "kpush-image": "KPUSH_IMAGE",
		"build-namespace": "KPUSH_BUILD_NAMESPACE", "registry-secret": "KPUSH_REGISTRY_SECRET", "builder-resources": "KPUSH_BUILDER_RESOURCES",
		"builder-user": "KPUSH_BUILDER_USER", "source-addr": "KPUSH_SOURCE_ADDR", "source-url": "KPUSH_SOURCE_URL"})
}

// kind is the builder to use: b.Builder, else kube in a cluster (no kubeconfig), else local.
func (b *buildConfig) kind(kubeconfig string) string {
	if b.Builder != "" {
		return b.Builder
	}
	if kubeconfig == "" {
		return builderKube
	}
	return builderLocal
}

// validate joins every problem of the flags, each saying how to fix it.
func (b *buildConfig) validate(kubeconfig string) error {
	var errs []error
	switch b.kind(kubeconfig) {
	case builderLocal:
		return nil
	case builderKube:
	default:
		return fmt.Errorf("--builder %q: want kube or local", b.Builder)
	}
	if b.KpushImage == "" {
		errs = append(errs, errors.New("--kpush-image is empty: build Pods fetch the source with kpush's own image; set KPUSH_IMAGE to the image kpush runs from, or pass --builder local"))
	}
	if b.SourceURL == "" {
		errs = append(errs, errors.New("--source-url is empty: say how build Pods reach --source-addr, e.g. --source-url http://kpush.NAMESPACE.svc:8082/source (env KPUSH_SOURCE_URL)"))
	} else if u, err := url.Parse(b.SourceURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("--source-url %q: want an http:// or https:// URL, e.g. http://kpush.NAMESPACE.svc:8082/source", b.SourceURL))
	}
	if _, _, err := net.SplitHostPort(b.SourceAddr); err != nil {
		errs = append(errs, fmt.Errorf("--source-addr %q: want HOST:PORT, e.g. :8082", b.SourceAddr))
	}
	if _, err := b.resources(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := b.user(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (b *buildConfig) resources() (corev1.ResourceRequirements, error) {
	var r corev1.ResourceRequirements
	if b.Resources == "" {
		return r, nil
	}
	if err := json.Unmarshal([]byte(b.Resources), &r); err != nil {
		return r, fmt.Errorf(`--builder-resources: %w; want JSON like {"requests":{"cpu":"1","memory":"2Gi"}}`, err)
	}
	return r, nil
}

func (b *buildConfig) user() (uid, gid int64, err error) {
	if b.User == "" {
		if b.BuilderImage == "" || b.BuilderImage == buildpack.DefaultBuilderImage {
			return 1001, 1000, nil // Paketo's builders: cnb user 1001, group 1000
		}
		return 0, 0, nil // buildpack.PodSpec's default, 1000:1000
	}
	if _, err := fmt.Sscanf(b.User, "%d:%d", &uid, &gid); err != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("--builder-user %q: want UID:GID, e.g. 1001:1000", b.User)
	}
	return uid, gid, nil
}

// kube returns the build-Pod builder and starts the source endpoint it hands build contexts
// out from on b.SourceAddr; stop shuts the endpoint down.
func (b *buildConfig) kube(kcs kubernetes.Interface, namespace, registry, runImage string, log *slog.Logger) (k *buildpack.Kube, stop func(), err error) {
	res, err := b.resources()
	if err != nil {
		return nil, nil, err
	}
	uid, gid, err := b.user()
	if err != nil {
		return nil, nil, err
	}
	ns := b.Namespace
	if ns == "" {
		ns = namespace
	}
	var insecure []string
	if repo, err := name.NewRepository(registry); err == nil && repo.Registry.Scheme() == "http" {
		insecure = []string{repo.RegistryStr()}
	}
	sources := &buildpack.SourceServer{Log: log}
	l, err := net.Listen("tcp", b.SourceAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening for build Pods' source fetches: %w (choose another address with --source-addr)", err)
	}
	// Every GET is a fetch, whatever its path (buildpack.SourceServer).
	hs := &http.Server{Handler: sources, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(l)
	log.Info("build source endpoint", "addr", l.Addr().String(), "url", b.SourceURL, "build_namespace", ns)
	k = &buildpack.Kube{
		Client:             kcs,
		Namespace:          ns,
		Sources:            sources,
		SourceURL:          b.SourceURL,
		KpushImage:         b.KpushImage,
		BuilderImage:       b.BuilderImage,
		RunImage:           runImage,
		RegistrySecret:     b.RegistrySecret,
		Resources:          res,
		UserID:             uid,
		GroupID:            gid,
		InsecureRegistries: insecure,
		Log:                log,
	}
	return k, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
	}, nil
}
