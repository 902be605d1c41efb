package gitserver

// Benchmarks of kpush's git transport, side by side with native git.
//
// Each benchmark has a kpush-ssh arm (the system git client through the system ssh client to
// a real Server on 127.0.0.1, git upload-pack/receive-pack behind it, the pre-receive hook
// calling back into the Server) and native-file arms (the same git client on a file:// URL
// with --no-local, so git runs the same upload-pack/receive-pack pair over pipes). There is
// no native-ssh arm: the machine has no sshd to serve plain git over SSH, so the kpush/native
// ratio includes the SSH session (key exchange, auth, channel) as well as kpush's own work.
//
//	go test -run '^$' -bench . -benchtime 5x ./gitserver/

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	benchFiles    = 2000     // files in the generated repository
	benchFileSize = 10 << 10 // bytes per file: a 20 MB work tree
	benchCommits  = 3        // the first adds every file, the others rewrite benchTouched
	benchTouched  = 5        // files each incremental commit rewrites
)

// writeRandomFile writes size bytes of base64 text (random, so git cannot delta it away;
// text, so zlib compresses it about as much as source code) to dir/name.
func writeRandomFile(b *testing.B, dir, name string, size int) {
	b.Helper()
	raw := make([]byte, size*3/4)
	rand.Read(raw)
	text := base64.StdEncoding.EncodeToString(raw)
	var sb strings.Builder
	for len(text) > 76 {
		sb.WriteString(text[:76])
		sb.WriteByte('\n')
		text = text[76:]
	}
	sb.WriteString(text)
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
}

func benchFileName(i int) string { return fmt.Sprintf("pkg%02d/file%04d.txt", i%40, i) }

// touchAndCommit rewrites benchTouched files of the work tree dir (chosen by round) and
// commits them; it returns the new commit's ID.
func touchAndCommit(b *testing.B, g *gitClient, dir string, round int) string {
	b.Helper()
	for j := range benchTouched {
		writeRandomFile(b, dir, benchFileName((round*benchTouched+j*397)%benchFiles), benchFileSize)
	}
	g.must(dir, "add", "-A")
	g.must(dir, "commit", "-q", "-m", fmt.Sprintf("round %d", round))
	return g.must(dir, "rev-parse", "HEAD")
}

// benchRepo generates a work tree with benchFiles files over benchCommits commits on main.
func benchRepo(b *testing.B, g *gitClient) string {
	b.Helper()
	dir := b.TempDir()
	g.must(dir, "init", "-q", "-b", "main")
	for i := range benchFiles {
		writeRandomFile(b, dir, benchFileName(i), benchFileSize)
	}
	g.must(dir, "add", "-A")
	g.must(dir, "commit", "-q", "-m", "initial")
	for round := 1; round < benchCommits; round++ {
		touchAndCommit(b, g, dir, round)
	}
	return dir
}

// packBytes is the total size of the pack files of the bare repository dir.
func packBytes(b *testing.B, dir string) int64 {
	b.Helper()
	packs, err := filepath.Glob(filepath.Join(dir, "objects", "pack", "*.pack"))
	if err != nil || len(packs) == 0 {
		b.Fatalf("no packs in %s (%v)", dir, err)
	}
	var n int64
	for _, p := range packs {
		fi, err := os.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// acceptAll accepts every push: the pre-receive round trip (hook process, callback into the
// Server, handler) without any work in the handler.
var acceptAll = HandlerFunc(func(context.Context, *Push, io.Writer) error { return nil })

// BenchmarkClone clones a generated repository (benchFiles files, benchCommits commits) from
// kpush over SSH and from the same bare repository with native git over file://. Clones are
// --no-checkout: checking out is the same local work on both arms and only dilutes the
// transport's ratio. Bytes/op is the repository's pack size.
func BenchmarkClone(b *testing.B) {
	ts := startServer(b, acceptAll)
	g := ts.git(b, ts.aliceKey)
	work := benchRepo(b, g)
	head := g.must(work, "rev-parse", "HEAD")
	g.must(work, "push", "-q", ts.scpURL("bench"), "main")
	bare := filepath.Join(ts.dataDir, "repos", "bench.git")
	size := packBytes(b, bare)
	b.Logf("repository: %d files, %d commits, pack %.1f MB", benchFiles, benchCommits, float64(size)/1e6)

	for _, arm := range []struct{ name, url string }{
		{"kpush-ssh", ts.sshURL("bench")},
		{"native-file", "file://" + bare},
	} {
		b.Run(arm.name, func(b *testing.B) {
			b.SetBytes(size)
			parent := b.TempDir()
			var dst string
			for i := range b.N {
				b.StopTimer()
				if dst != "" {
					os.RemoveAll(dst)
				}
				dst = filepath.Join(parent, fmt.Sprint(i))
				b.StartTimer()
				g.must("", "clone", "-q", "--no-local", "--no-checkout", arm.url, dst)
			}
			b.StopTimer()
			if got := g.must(dst, "rev-parse", "HEAD"); got != head {
				b.Fatalf("clone HEAD = %s, want %s", got, head)
			}
		})
	}
}

// BenchmarkPush pushes one fresh commit rewriting benchTouched files onto a repository that
// already holds the generated history (an incremental push: a small thin pack). kpush-ssh
// goes through the pre-receive hook and a handler that accepts; native-file pushes to a bare
// repository without hooks, native-file-hook to one whose pre-receive hook is `cat`, so the
// cost of running any hook at all is visible. The native repositories keep pushed packs as
// packs (receive.unpackLimit=1), as kpush's do.
func BenchmarkPush(b *testing.B) {
	ts := startServer(b, acceptAll)
	g := ts.git(b, ts.aliceKey)
	src := benchRepo(b, g)

	nativeBare := func(hook bool) string {
		dir := filepath.Join(b.TempDir(), "native.git")
		g.must("", "init", "-q", "--bare", "--initial-branch=main", "--template=", dir)
		g.must(dir, "config", "receive.unpackLimit", "1")
		if hook {
			if err := os.MkdirAll(filepath.Join(dir, "hooks"), 0o755); err != nil {
				b.Fatal(err)
			}
			script := "#!/bin/sh\ncat >/dev/null\n"
			if err := os.WriteFile(filepath.Join(dir, "hooks", "pre-receive"), []byte(script), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		return "file://" + dir
	}
	for _, arm := range []struct {
		name, url, gitDir string
	}{
		{"kpush-ssh", ts.sshURL("bench"), filepath.Join(ts.dataDir, "repos", "bench.git")},
		{"native-file", nativeBare(false), ""},
		{"native-file-hook", nativeBare(true), ""},
	} {
		if arm.gitDir == "" {
			arm.gitDir = strings.TrimPrefix(arm.url, "file://")
		}
		// Each arm pushes from its own clone of the generated history, which is pushed once.
		work := filepath.Join(b.TempDir(), "work")
		g.must("", "clone", "-q", src, work)
		g.must(work, "push", "-q", arm.url, "main")
		round := benchCommits
		b.Run(arm.name, func(b *testing.B) {
			var head string
			for range b.N {
				b.StopTimer()
				head = touchAndCommit(b, g, work, round)
				round++
				b.StartTimer()
				g.must(work, "push", "-q", arm.url, "main")
			}
			b.StopTimer()
			if got := g.must("", "--git-dir="+arm.gitDir, "rev-parse", "refs/heads/main"); got != head {
				b.Fatalf("%s main = %s after the push, want %s", arm.name, got, head)
			}
		})
	}
}

// BenchmarkLsRemote lists the refs of a one-commit repository: next to nothing is
// transferred, so it measures the fixed cost of one git connection (for kpush-ssh: ssh's
// start, key exchange, public key authentication, the session and git upload-pack's start),
// the part of every clone and push that does not grow with the repository.
func BenchmarkLsRemote(b *testing.B) {
	ts := startServer(b, acceptAll)
	g := ts.git(b, ts.aliceKey)
	work := b.TempDir()
	g.must(work, "init", "-q", "-b", "main")
	writeRandomFile(b, work, "hello.txt", 100)
	g.must(work, "add", "-A")
	g.must(work, "commit", "-q", "-m", "hello")
	head := g.must(work, "rev-parse", "HEAD")
	g.must(work, "push", "-q", ts.scpURL("small"), "main")
	for _, arm := range []struct{ name, url string }{
		{"kpush-ssh", ts.sshURL("small")},
		{"native-file", "file://" + filepath.Join(ts.dataDir, "repos", "small.git")},
	} {
		b.Run(arm.name, func(b *testing.B) {
			var out string
			for range b.N {
				out = g.must("", "ls-remote", arm.url, "refs/heads/main")
			}
			b.StopTimer()
			if want := head + "\trefs/heads/main"; out != want {
				b.Fatalf("ls-remote = %q, want %q", out, want)
			}
		})
	}
}
