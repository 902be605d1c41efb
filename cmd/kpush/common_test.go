package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/gitserver/access"
)

// TestCheckAdmins: kpush refuses to start when bootstrap left no server admin with a key,
// naming each refused key and why.
func TestCheckAdmins(t *testing.T) {
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ed, err := gossh.NewPublicKey(edPub)
	if err != nil {
		t.Fatal(err)
	}
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	weak, err := gossh.NewPublicKey(&small.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	line := func(k gossh.PublicKey, comment string) string {
		return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))) + " " + comment + "\n"
	}
	for _, tc := range []struct {
		name    string
		keys    string
		wantErr []string // substrings; none: no error
	}{
		{name: "ed25519", keys: line(ed, "alice@laptop")},
		{name: "a good key beside a weak one", keys: line(weak, "old@box") + line(ed, "alice@laptop")},
		{
			name: "only a 1024-bit RSA key",
			keys: line(weak, "old@box"),
			wantErr: []string{"no server admin has a usable SSH key", gossh.FingerprintSHA256(weak) + " (old@box)",
				"ssh-rsa key of 1024 bits is too small", "ssh-keygen -t ed25519"},
		},
		{name: "no key at all", keys: "# nobody\n", wantErr: []string{"--authorized-keys holds no public key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "authorized_keys")
			if err := os.WriteFile(file, []byte(tc.keys), 0o600); err != nil {
				t.Fatal(err)
			}
			acc, err := access.Open(dir, access.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			if err := acc.Bootstrap(file); err != nil {
				t.Fatal(err)
			}
			err = checkAdmins(acc, []string{file})
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("checkAdmins: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("checkAdmins: nil, want an error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("checkAdmins error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestBuildConfigValidate(t *testing.T) {
	ok := buildConfig{Builder: builderKube, KpushImage: "registry.example.com/kpush@sha256:00", SourceAddr: ":8082", SourceURL: "http://kpush.ns.svc:8082/source"}
	for _, tc := range []struct {
		name       string
		change     func(b *buildConfig)
		kubeconfig string
		wantErr    string
	}{
		{name: "kube", change: func(*buildConfig) {}},
		{name: "local needs nothing", change: func(b *buildConfig) { *b = buildConfig{Builder: builderLocal} }},
		{name: "default is local with a kubeconfig", change: func(b *buildConfig) { *b = buildConfig{} }, kubeconfig: "/kubeconfig"},
		{name: "default is kube in a cluster", change: func(b *buildConfig) { *b = buildConfig{SourceAddr: ":8082"} }, wantErr: "--kpush-image is empty"},
		{name: "unknown builder", change: func(b *buildConfig) { b.Builder = "docker" }, wantErr: `--builder "docker"`},
		{name: "no source URL", change: func(b *buildConfig) { b.SourceURL = "" }, wantErr: "--source-url is empty"},
		{name: "bad source URL", change: func(b *buildConfig) { b.SourceURL = "kpush:8082" }, wantErr: "want an http:// or https:// URL"},
		{name: "bad resources", change: func(b *buildConfig) { b.Resources = `{"requests":{"cpu":"lots"}}` }, wantErr: "--builder-resources"},
		{name: "resources", change: func(b *buildConfig) { b.Resources = `{"requests":{"cpu":"1"},"limits":{"memory":"2Gi"}}` }},
		{name: "bad user", change: func(b *buildConfig) { b.User = "cnb" }, wantErr: "--builder-user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := ok
			tc.change(&b)
			err := b.validate(tc.kubeconfig)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("validate: %v, want error %q", err, tc.wantErr)
			}
		})
	}
}
