package receiver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
	"kpush.dev/kpush/gitserver/access"
)

// TestSSHHintAgrees: the SSH server's "key is not registered" message and the pipeline's
// "queued behind" message name the same ssh command, wired as kpush serve and dev wire them
// (gitserver.WithPublicAddr, Pipeline.Addr from the same gitserver.Hint): --public-addr when
// set, without -p on port 22, else the listener's address.
func TestSSHHintAgrees(t *testing.T) {
	for _, tc := range []struct {
		name, public string
		want         string // PORT: the listener's port
	}{
		{name: "public addr on port 22", public: "git.example.com:22", want: "ssh git@git.example.com"},
		{name: "public addr on another port", public: "git.example.com:2022", want: "ssh -p 2022 git@git.example.com"},
		{name: "no public addr", want: "ssh -p PORT git@127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			_, port, _ := net.SplitHostPort(l.Addr().String())
			want := strings.ReplaceAll(tc.want, "PORT", port)

			p, push := hintPipeline(t)
			p.Addr = gitserver.NewHint(tc.public, l.Addr().String()).Addr() // as serveGit does
			dataDir := t.TempDir()
			acc, err := access.Open(dataDir, access.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			opts := []gitserver.Option{gitserver.WithDataDir(dataDir), gitserver.WithAccess(acc)}
			if tc.public != "" {
				opts = append(opts, gitserver.WithPublicAddr(tc.public))
			}
			srv, err := gitserver.New(p, opts...)
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })

			if got, wantMsg := unregisteredKeyMessage(t, l.Addr().String()), "ask an admin to run: "+want+" keys:add NAME --user USER < key.pub"; !strings.Contains(got, wantMsg) {
				t.Errorf("unregistered key told %q, want %q", got, wantMsg)
			}
			if got, wantMsg := push(), "; if it is stuck, an admin can run: "+want+" apps:unlock demo"; !strings.Contains(got, wantMsg) {
				t.Errorf("queued push told:\n%s\nwant %q", got, wantMsg)
			}
		})
	}
}

// hintPipeline returns a pipeline whose first build of app demo waits until a second push
// queued behind it, and push, which makes those two pushes and returns what the second
// pusher was told.
func hintPipeline(t *testing.T) (*Pipeline, func() string) {
	t.Helper()
	bare, c0 := repo(t, map[string]string{"Procfile": "web: sleep 1\n"})
	run(t, bare, "git", "update-ref", "refs/heads/main", c0)
	c := children(t, bare, c0, "A", "B")
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	building, gate := make(chan struct{}), make(chan struct{})
	p := &Pipeline{
		Store:    store,
		Registry: "127.0.0.1:5000/kpush",
		Builder: builderFunc(func(ctx context.Context, r buildpack.Request, _ io.Writer) (buildpack.Result, error) {
			if b, _ := os.ReadFile(filepath.Join(r.SourceDir, "which")); string(b) == "A" {
				close(building)
				select {
				case <-gate:
				case <-ctx.Done():
					return buildpack.Result{}, ctx.Err()
				}
			}
			return buildpack.Result{Image: "127.0.0.1:5000/kpush/demo@sha256:" + fmt.Sprintf("%064x", 1)}, nil
		}),
		Deployer: deployerFunc(func(context.Context, deployer.Release, io.Writer) (string, error) {
			return "http://demo.example.com", nil
		}),
	}
	push := func() string {
		ctx := context.Background()
		pushOf := func(id, commit string) *gitserver.Push {
			return &gitserver.Push{ID: id, App: "demo", Dir: bare, User: "alice",
				Updates: []gitserver.RefUpdate{{Old: c0, New: commit, Name: "refs/heads/main"}}}
		}
		doneA := make(chan error, 1)
		go func() { doneA <- p.PreReceive(ctx, pushOf("pA", c["A"]), io.Discard) }()
		<-building
		outB, doneB := &syncBuffer{}, make(chan error, 1)
		go func() { doneB <- p.PreReceive(ctx, pushOf("pB", c["B"]), outB) }()
		waitFor(t, "B to queue", func() bool { return strings.Contains(outB.String(), "queued behind") })
		close(gate)
		<-doneA
		<-doneB
		return outB.String()
	}
	return p, push
}

// unregisteredKeyMessage logs in to the SSH server at addr with a new key nobody registered
// and returns what the server wrote to stderr.
func unregisteredKeyMessage(t *testing.T, addr string) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	var exit *gossh.ExitError
	if err := sess.Run("apps"); !errors.As(err, &exit) || exit.ExitStatus() != 1 {
		t.Fatalf("unregistered key ran apps: %v, want exit status 1\n%s", err, stderr.String())
	}
	return stderr.String()
}
