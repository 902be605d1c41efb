package receiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/internal/term"
)

// RegistryCollector is a registry kpush runs itself and collects the garbage of (dev mode's
// local.Registry): a build and its deploy Hold it, so that a collection never runs under
// them, and apps:destroy asks for a collection (CollectGarbage) once it deleted the app's
// images.
type RegistryCollector interface {
	// Hold keeps garbage collection off until release is called, waiting for one that runs.
	Hold(ctx context.Context) (release func(), err error)
	// CollectGarbage asks for a collection as soon as nothing holds the registry, and
	// returns at once.
	CollectGarbage()
}

// preflightTimeout bounds the registry check before a build: a registry that is down or
// refuses the build's credentials fails the push in seconds instead of at the export.
const preflightTimeout = 5 * time.Second

// preflight holds the registry (RegistryGC) for the build and deploy of app, and checks that
// the app's image repository takes pushes with the credentials the build's export uses,
// before any build step runs. The error is phrased for people; the detail goes to log.
func (p *Pipeline) preflight(ctx context.Context, log *slog.Logger, app string) (release func(), err error) {
	release = func() {}
	if p.RegistryGC != nil {
		if release, err = p.RegistryGC.Hold(ctx); err != nil {
			log.Error("holding the registry for the build", "err", err)
			return nil, errors.New("the registry is shutting down; push again once kpush runs")
		}
	}
	if err := p.checkRegistry(ctx, log, app); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// checkRegistry checks that "<Registry>/<app>" accepts a push (a blob upload begun and
// cancelled, which is what docker.io needs to tell) with the export's credentials, or, when
// only a build Pod has those, that kpush's own credentials may read it. Builders other than
// buildpack.Local and buildpack.Kube are not checked: kpush does not know their credentials.
func (p *Pipeline) checkRegistry(ctx context.Context, log *slog.Logger, app string) error {
	if p.Registry == "" {
		return nil
	}
	repo, err := name.NewRepository(p.Registry + "/" + app)
	if err != nil {
		log.Error("parsing the app's image repository", "repository", p.Registry+"/"+app, "err", err)
		return fmt.Errorf("the image repository %s/%s is not valid: check --registry", p.Registry, app)
	}
	auth, scope, fix := authn.Anonymous, transport.PushScope, "check --registry"
	switch b := p.Builder.(type) {
	case *buildpack.Local:
		// Its analyze, restore and export phases get this login (CNB_REGISTRY_AUTH), or none.
		if b.RegistryUsername != "" {
			auth = &authn.Basic{Username: b.RegistryUsername, Password: b.RegistryPassword}
			fix = "kpush dev runs this registry itself: restart kpush dev, and see the server log"
		}
	case *buildpack.Kube:
		if b.RegistrySecret != "" {
			kc := b.Keychain
			if kc == nil {
				kc = authn.DefaultKeychain
			}
			if auth, err = kc.Resolve(repo); err != nil || auth == authn.Anonymous {
				// Only the build Pod's export has the registry Secret; kpush cannot check it.
				log.Debug("registry check skipped: kpush has no credentials of its own for the registry; the build Pod's Secret has them",
					"repository", repo.String(), "secret", b.RegistrySecret, "err", err)
				return nil
			}
			// kpush's credentials read the image back after the build; they need not push.
			scope, fix = transport.PullScope, "check kpush's registry credentials ($DOCKER_CONFIG) and the registry Secret (--registry-secret "+b.RegistrySecret+")"
		} else {
			fix = "check --registry, or give the build Pods push access with --registry-secret"
		}
	default:
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	err = probeRegistry(ctx, repo, auth, scope)
	if err == nil {
		log.Debug("registry check passed", "repository", repo.String(), "scope", scope, "duration", time.Since(start))
		return nil
	}
	log.Error("registry check failed before the build", "repository", repo.String(), "scope", scope,
		"duration", time.Since(start), "err", err)
	host := term.Sanitize(repo.RegistryStr())
	var te *transport.Error
	switch {
	case errors.As(err, &te) && (te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden):
		return fmt.Errorf("registry %s refused kpush's credentials for %s (HTTP %d %s); nothing was built\n !     fix: %s",
			host, term.Sanitize(repo.RepositoryStr()), te.StatusCode, http.StatusText(te.StatusCode), fix)
	case errors.As(err, &te):
		return fmt.Errorf("registry %s answered HTTP %d %s; nothing was built\n !     fix: %s",
			host, te.StatusCode, http.StatusText(te.StatusCode), fix)
	default:
		return fmt.Errorf("registry %s is unreachable (%s); nothing was built\n !     fix: %s", host, netReason(ctx, err), fix)
	}
}

// probeRegistry pings reg's /v2/ and authenticates for scope ("push" or "pull") on repo; for
// a push it begins a blob upload and cancels it, for a pull it lists the tags (a repository
// not pushed yet answers 404, which still proves the credentials).
func probeRegistry(ctx context.Context, repo name.Repository, auth authn.Authenticator, scope string) error {
	t, err := transport.NewWithContext(ctx, repo.Registry, auth, http.DefaultTransport, []string{repo.Scope(scope)})
	if err != nil {
		return err
	}
	c := &http.Client{Transport: t}
	base := repo.Registry.Scheme() + "://" + repo.RegistryStr() + "/v2/" + repo.RepositoryStr()
	method, url, want := http.MethodPost, base+"/blobs/uploads/", []int{http.StatusAccepted}
	if scope == transport.PullScope {
		method, url, want = http.MethodGet, base+"/tags/list", []int{http.StatusOK, http.StatusNotFound}
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, want...); err != nil {
		return err
	}
	if loc := resp.Header.Get("Location"); method == http.MethodPost && loc != "" {
		// The upload was only to see whether it may begin; cancel it so that the registry
		// does not keep it until it purges stale uploads.
		u, err := req.URL.Parse(loc)
		if err == nil {
			if del, err := http.NewRequestWithContext(ctx, http.MethodDelete, u.String(), nil); err == nil {
				if r, err := c.Do(del); err == nil {
					r.Body.Close()
				}
			}
		}
	}
	return nil
}

// netReason says in a few words why a request to the registry failed.
func netReason(ctx context.Context, err error) string {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Sprintf("no answer within %s", preflightTimeout)
	case errors.As(err, &dnsErr):
		return "its name does not resolve"
	default:
		return "the connection failed; the server log has details"
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
