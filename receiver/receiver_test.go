package receiver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/deployer"
	"kpush.dev/kpush/gitserver"
)

func TestIndent(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"one line", []string{"a\n"}, "       a\n"},
		{"split line", []string{"ab", "c\nd", "e\n"}, "       abc\n       de\n"},
		{"no trailing newline", []string{"x\ny"}, "       x\n       y"},
		{"empty lines", []string{"\n\n"}, "       \n       \n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			w := indent(&b)
			for _, s := range tt.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
		})
	}
}

// repo makes a bare repository whose HEAD points at refs/heads/main, and a commit on a
// work clone holding files; it returns the bare dir and the commit's object name.
func repo(t *testing.T, files map[string]string) (bare, commit string) {
	t.Helper()
	dir := t.TempDir()
	bare = filepath.Join(dir, "app.git")
	work := filepath.Join(dir, "work")
	run(t, "", "git", "init", "-q", "--bare", "--initial-branch=main", bare)
	run(t, "", "git", "init", "-q", "--initial-branch=main", work)
	for name, body := range files {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, work, "git", "add", "-A")
	run(t, work, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "c")
	// The objects land in the bare repo without moving any ref, as they would be in a push.
	run(t, work, "git", "push", "-q", bare, "HEAD:refs/kpush-test/tmp")
	run(t, bare, "git", "update-ref", "-d", "refs/kpush-test/tmp")
	return bare, strings.TrimSpace(run(t, work, "git", "rev-parse", "HEAD"))
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

type builderFunc func(context.Context, buildpack.Request, io.Writer) (buildpack.Result, error)

func (f builderFunc) Build(ctx context.Context, r buildpack.Request, out io.Writer) (buildpack.Result, error) {
	return f(ctx, r, out)
}

type deployerFunc func(context.Context, deployer.Release, io.Writer) (string, error)

func (f deployerFunc) Deploy(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
	return f(ctx, r, out)
}

// TestPreReceive drives the pipeline with a real repository and func adapters standing in
// for the builder and deployer, to inject failures (the real ones run in test/).
func TestPreReceive(t *testing.T) {
	const digest = "127.0.0.1:5000/kpush/demo@sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"
	bare, commit := repo(t, map[string]string{"Procfile": "web: sleep 1\n"})
	tests := []struct {
		name       string
		updates    []gitserver.RefUpdate
		buildErr   error
		deployErr  error
		wantErr    bool
		wantBuilds int
		wantOut    []string
	}{
		{"deploy branch", []gitserver.RefUpdate{{Old: gitserver.ZeroID, New: commit, Name: "refs/heads/main"}}, nil, nil, false, 1,
			[]string{"-----> Building demo from main (" + commit[:7] + "), pushed by alice, release v1", "       built", "-----> Deploying " + digest,
				"-----> Released demo v1 (" + commit[:7] + ")", "       http://demo.example.com"}},
		{"other branch", []gitserver.RefUpdate{{Old: gitserver.ZeroID, New: commit, Name: "refs/heads/feature"}}, nil, nil, false, 0,
			[]string{"Stored refs/heads/feature at " + commit[:7] + "; deploys come from main, not building"}},
		{"build fails", []gitserver.RefUpdate{{Old: gitserver.ZeroID, New: commit, Name: "refs/heads/main"}}, errors.New("build failed: see the buildpack output above"), nil, true, 1,
			[]string{" !     build failed: see the buildpack output above", "nothing was deployed and the branch did not move"}},
		{"deploy fails", []gitserver.RefUpdate{{Old: gitserver.ZeroID, New: commit, Name: "refs/heads/main"}}, nil, errors.New("not ready"), true, 1,
			[]string{"deploy failed: not ready"}},
		{"delete deploy branch", []gitserver.RefUpdate{{Old: commit, New: gitserver.ZeroID, Name: "refs/heads/main"}}, nil, nil, true, 0,
			[]string{"refusing to delete the deploy branch main of app demo"}},
		{"stale base", []gitserver.RefUpdate{{Old: commit, New: commit, Name: "refs/heads/main"}}, nil, nil, true, 0,
			[]string{"main moved to 0000000 while this push waited (it was made on " + commit[:7] + ")", "git pull --rebase && git push"}},
	}
	// What a first deploy must not claim: there is no previous release.
	wantNot := map[string]string{"deploy fails": "the previous release keeps serving"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			builds := 0
			store, err := OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			p := &Pipeline{
				Store:    store,
				Registry: "127.0.0.1:5000/kpush",
				Builder: builderFunc(func(ctx context.Context, r buildpack.Request, out io.Writer) (buildpack.Result, error) {
					builds++
					if _, err := os.Stat(filepath.Join(r.SourceDir, "Procfile")); err != nil {
						t.Errorf("source tree not extracted: %v", err)
					}
					if r.Image != "127.0.0.1:5000/kpush/demo" {
						t.Errorf("image repository = %q", r.Image)
					}
					io.WriteString(out, "built\n")
					return buildpack.Result{Image: digest}, tt.buildErr
				}),
				Deployer: deployerFunc(func(ctx context.Context, r deployer.Release, out io.Writer) (string, error) {
					if r.Image != digest || r.Commit != commit || r.Pusher != "alice" || r.App != "demo" {
						t.Errorf("release = %+v", r)
					}
					return "http://demo.example.com", tt.deployErr
				}),
			}
			var out bytes.Buffer
			err = p.PreReceive(context.Background(), &gitserver.Push{ID: "p1", App: "demo", Dir: bare, User: "alice", Updates: tt.updates}, &out)
			if (err != nil) != tt.wantErr {
				t.Errorf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if builds != tt.wantBuilds {
				t.Errorf("builds = %d, want %d", builds, tt.wantBuilds)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if w := wantNot[tt.name]; w != "" && strings.Contains(out.String(), w) {
				t.Errorf("output of a first deploy says %q:\n%s", w, out.String())
			}
		})
	}
}
