package buildpack

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"kpush.dev/kpush/internal/archive"
	"kpush.dev/kpush/internal/names"
)

// DefaultSourceTTL is how long a SourceServer token stays valid when SourceServer.TTL is zero.
const DefaultSourceTTL = 10 * time.Minute

// SourceTokenEnv is the environment variable `kpush source fetch` reads its token from when no
// --token-file is given; build Pods set it on the source-fetch container only.
const SourceTokenEnv = "KPUSH_SOURCE_TOKEN"

// PlatformEnvEnv is the environment variable holding a build's platform environment as a JSON
// object {"NAME": "value"}; `kpush source fetch --platform DIR` writes it to DIR/env/NAME
// (kpack's PLATFORM_ENV_VARS, https://github.com/buildpacks/spec/blob/main/platform.md#buildpack-environment).
const PlatformEnvEnv = "KPUSH_PLATFORM_ENV"

// SourceServer hands build contexts to build Pods: kpush registers a build's source tree under
// a random single-use token, the Pod's source-fetch container (`kpush source fetch`) GETs it
// with "Authorization: Bearer <token>" and receives a gzip-compressed tar of the tree. A token
// works once and expires after TTL; a wrong, expired or spent token gets 403 with a one-line
// plain-text reason. Tokens are compared in constant time (as SHA-256 digests) and never
// logged. Safe for concurrent use; the zero value is ready (TTL DefaultSourceTTL, the real
// clock, no logging). Mount it at any path: every GET is a fetch.
type SourceServer struct {
	// TTL is how long a token is valid after Register. Zero: DefaultSourceTTL.
	TTL time.Duration
	// Now is the clock; nil means time.Now (tests inject one to expire tokens).
	Now func() time.Time
	// Log gets internal detail (fetches, refusals, never tokens). Nil: discarded.
	Log *slog.Logger

	mu      sync.Mutex
	entries []*sourceEntry
}

type sourceEntry struct {
	hash    [sha256.Size]byte
	label   string // for logs: the build it belongs to
	expires time.Time
	spent   bool
	write   func(io.Writer) error // writes the uncompressed tar
}

func (s *SourceServer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *SourceServer) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Register makes dir's tree (regular files, directories, symlinks; see TarDir) fetchable once
// with the returned token (43 URL-safe base64 characters, 256 random bits). label names the
// build in logs. The tree is read at fetch time, so dir must stay until the fetch or Revoke.
func (s *SourceServer) Register(label, dir string) (string, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("registering build source: %q is not a directory", dir)
	}
	return s.RegisterFunc(label, func(w io.Writer) error { return TarDir(w, dir) }), nil
}

// RegisterFunc is Register for a tree produced on demand: write writes an uncompressed tar
// stream (e.g. `git archive` output) and is called at most once, at fetch time.
func (s *SourceServer) RegisterFunc(label string, write func(io.Writer) error) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	token := base64.RawURLEncoding.EncodeToString(b[:])
	e := &sourceEntry{hash: sha256.Sum256([]byte(token)), label: label, expires: s.now().Add(s.ttl()), write: write}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.purgeLocked()
	s.entries = append(s.entries, e)
	return token
}

// Revoke forgets token (spent or not); later fetches with it get 403. Call it when the build
// ends.
func (s *SourceServer) Revoke(token string) {
	h := sha256.Sum256([]byte(token))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range s.entries {
		if subtle.ConstantTimeCompare(e.hash[:], h[:]) == 1 {
			s.entries = append(s.entries[:i], s.entries[i+1:]...)
			return
		}
	}
}

func (s *SourceServer) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return DefaultSourceTTL
}

// purgeLocked drops entries that expired more than one TTL ago (until then, their tokens are
// refused as "expired" rather than "not valid").
func (s *SourceServer) purgeLocked() {
	now := s.now()
	kept := s.entries[:0]
	for _, e := range s.entries {
		if now.Before(e.expires.Add(s.ttl())) {
			kept = append(kept, e)
		}
	}
	clear(s.entries[len(kept):])
	s.entries = kept
}

// claim finds the entry for token and marks it spent. It returns the entry, or the reason for
// refusing the token.
func (s *SourceServer) claim(token string) (*sourceEntry, string) {
	h := sha256.Sum256([]byte(token))
	s.mu.Lock()
	defer s.mu.Unlock()
	var found *sourceEntry
	for _, e := range s.entries {
		// Compare with every entry, so the time taken does not depend on which one matches.
		if subtle.ConstantTimeCompare(e.hash[:], h[:]) == 1 {
			found = e
		}
	}
	switch {
	case found == nil:
		return nil, "source token is not valid"
	case found.spent:
		return nil, "source token was already used: each build fetches its source once"
	case !s.now().Before(found.expires):
		return nil, "source token expired: push again"
	}
	found.spent = true
	return found, ""
}

// ServeHTTP answers GET with the build context as application/gzip (a gzip-compressed tar),
// 403 for a missing, wrong, expired or spent token, 405 for other methods.
func (s *SourceServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "only GET fetches a build source", http.StatusMethodNotAllowed)
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		s.log().Warn("source fetch refused", "remote", r.RemoteAddr, "reason", "no bearer token")
		http.Error(w, "source fetch needs Authorization: Bearer <token>", http.StatusForbidden)
		return
	}
	e, reason := s.claim(token)
	if e == nil {
		s.log().Warn("source fetch refused", "remote", r.RemoteAddr, "reason", reason)
		http.Error(w, reason, http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Cache-Control", "no-store")
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // the level is valid
	err := e.write(zw)
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		// Headers are gone: breaking the stream makes the client's gzip/tar reader fail.
		s.log().Error("serving build source", "build", e.label, "err", err)
		panic(http.ErrAbortHandler)
	}
	s.log().Info("build source fetched", "build", e.label, "remote", r.RemoteAddr)
}

// TarDir writes dir's tree to w as an uncompressed tar with relative, slash-separated names:
// directories (0755), regular files (0755 if any execute bit is set, else 0644) and symlinks
// (target kept verbatim); owner 0:0, zero timestamps. Other file types are skipped.
func TarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: name, Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", 0o755
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		case d.Type().IsRegular():
			h.Typeflag, h.Size, h.Mode = tar.TypeReg, info.Size(), 0o644
			if info.Mode()&0o111 != 0 {
				h.Mode = 0o755
			}
		default:
			return nil
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, h.Size)
		return err
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	return tw.Close()
}

// ExtractTar extracts an uncompressed tar stream into the existing directory dest as a source
// tree (internal/archive with zero Options): directories 0755, regular files 0755 when the
// entry has any execute bit, else 0644, symlinks as they are and never written through.
// Nothing outside dest can be created or changed: an entry with "..", an absolute name, or a
// path through a symlink fails the extraction (archive.ErrUnsafe), hard links must point at
// an earlier entry inside dest, device and FIFO entries are skipped.
func ExtractTar(r io.Reader, dest string) error {
	return archive.Extract(context.Background(), r, dest, archive.Options{MaxBytes: archive.SourceMaxBytes})
}

// FetchSource downloads a build context from a SourceServer at url with token and extracts it
// into the existing directory dest (ExtractTar's rules). client nil means a client with a 5-minute
// timeout. A refusal comes back as an error carrying the server's reason, e.g. "fetching build
// source: 403 Forbidden: source token was already used: ...".
func FetchSource(ctx context.Context, client *http.Client, url, token, dest string) error {
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Minute}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("fetching build source: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("fetching build source: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("fetching build source: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		return fmt.Errorf("fetching build source: %w", err)
	}
	if err := archive.Extract(ctx, zr, dest, archive.Options{MaxBytes: archive.SourceMaxBytes}); err != nil {
		return fmt.Errorf("fetching build source: %w", err)
	}
	return nil
}

// WritePlatformEnv writes the build environment encoded as PlatformEnvEnv's JSON object into
// platformDir/env/NAME files (0644), creating the env directory. Empty envJSON writes only the
// directory. Names must be valid variable names.
func WritePlatformEnv(platformDir, envJSON string) error {
	dir := filepath.Join(platformDir, "env")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing platform env: %w", err)
	}
	if envJSON == "" {
		return nil
	}
	var env map[string]string
	if err := json.Unmarshal([]byte(envJSON), &env); err != nil {
		return fmt.Errorf("parsing %s: %w", PlatformEnvEnv, err)
	}
	for k, v := range env {
		if !names.IsEnv(k) {
			return fmt.Errorf("writing platform env: variable name %q is invalid", k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			return fmt.Errorf("writing platform env: %w", err)
		}
	}
	return nil
}

// errNoToken is FetchSourceMain's error without a token.
var errNoToken = errors.New("no source token: pass --token-file or set " + SourceTokenEnv)

// SourceFetchOptions is what `kpush source fetch` was asked to do.
type SourceFetchOptions struct {
	URL       string // SourceServer URL
	TokenFile string // file holding the token; "" reads $KPUSH_SOURCE_TOKEN
	Dest      string // directory to extract into (created if missing)
	Platform  string // if set, $KPUSH_PLATFORM_ENV is written to Platform/env/NAME
}

// RunSourceFetch is `kpush source fetch`: it reads the token (TokenFile, else
// $KPUSH_SOURCE_TOKEN, trimmed), fetches and extracts the source into Dest, writes the platform
// env, and reports one line to out. getenv is os.Getenv in the command.
func RunSourceFetch(ctx context.Context, o SourceFetchOptions, getenv func(string) string, out io.Writer) error {
	token := getenv(SourceTokenEnv)
	if o.TokenFile != "" {
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			return fmt.Errorf("reading source token: %w", err)
		}
		token = string(b)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return errNoToken
	}
	if o.URL == "" || o.Dest == "" {
		return errors.New("--url and --dest are required")
	}
	if err := os.MkdirAll(o.Dest, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.Dest, err)
	}
	if err := FetchSource(ctx, nil, o.URL, token, o.Dest); err != nil {
		return err
	}
	if o.Platform != "" {
		if err := WritePlatformEnv(o.Platform, getenv(PlatformEnvEnv)); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "-----> Fetched the pushed source into %s\n", o.Dest)
	return nil
}
