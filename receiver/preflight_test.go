package receiver

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer/local"
	"kpush.dev/kpush/internal/tools"
)

// emptyKeychain has no credentials for any registry, like a kpush Pod without $DOCKER_CONFIG.
type emptyKeychain struct{}

func (emptyKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.Anonymous, nil
}

// TestCheckRegistry runs the pre-build registry check against the real dev registry (htpasswd
// auth): the export's login passes, a wrong one and a stopped registry fail in seconds with a
// message naming the registry and the fix, and a builder whose credentials kpush does not hold
// is not checked.
func TestCheckRegistry(t *testing.T) {
	if _, err := tools.Path("registry"); err != nil {
		t.Skip(err) // run make tools
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := local.StartRegistry(ctx, local.RegistryConfig{DataDir: t.TempDir(), StopGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	user, pass := reg.Credentials()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String() // nothing listens there once closed
	l.Close()
	devBuilder := func(u, p string) Builder {
		return &buildpack.Local{RegistryUsername: u, RegistryPassword: p}
	}
	for _, tc := range []struct {
		name     string
		registry string
		builder  Builder
		want     []string // substrings of the error; none: no error
	}{
		{"the export's login passes", reg.Addr() + "/kpush", devBuilder(user, pass), nil},
		{"a wrong login is refused", reg.Addr() + "/kpush", devBuilder(user, "wrong"),
			[]string{"registry " + reg.Addr() + " refused kpush's credentials for kpush/demo (HTTP 401 Unauthorized)", "fix: "}},
		{"anonymous pushes are refused", reg.Addr() + "/kpush", &buildpack.Local{},
			[]string{"registry " + reg.Addr() + " refused kpush's credentials", "check --registry"}},
		{"a registry that is down is unreachable", down + "/kpush", devBuilder(user, pass),
			[]string{"registry " + down + " is unreachable (connection refused)", "restart kpush dev"}},
		{"build Pods pushing anonymously are checked", down + "/kpush", &buildpack.Kube{Keychain: emptyKeychain{}},
			[]string{"registry " + down + " is unreachable", "--registry-secret"}},
		{"a build Pod's Secret kpush cannot read is not checked", down + "/kpush",
			&buildpack.Kube{RegistrySecret: "regcred", Keychain: emptyKeychain{}}, nil},
		{"a builder kpush does not know is not checked", down + "/kpush", builderFunc(nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pipeline{Registry: tc.registry, Builder: tc.builder}
			start := time.Now()
			err := p.checkRegistry(context.Background(), slog.New(slog.DiscardHandler), "demo")
			if d := time.Since(start); d > preflightTimeout+time.Second {
				t.Errorf("the check took %s", d)
			}
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("checkRegistry: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("checkRegistry passed, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), pass) {
				t.Error("the error shows the registry password")
			}
		})
	}
}
