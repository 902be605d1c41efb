package gitserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"
)

// HostKeyFile is the name of the server's host key inside the data directory.
const HostKeyFile = "ssh_host_ed25519_key"

// loadOrCreateHostKey returns the ed25519 host key stored at path in OpenSSH PEM format
// ("OPENSSH PRIVATE KEY", as ssh-keygen writes it), creating it with mode 0600 first if
// there is none. Two servers starting at once on one data dir agree on one key: the new key
// is written to a temporary file and hard-linked into place, and the loser reads the winner's.
func loadOrCreateHostKey(path string) (gossh.Signer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data, err = createHostKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("loading ssh host key %s: %w", path, err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("parsing ssh host key %s: %w (move it away to make a new one)", path, err)
	}
	return signer, nil
}

func createHostKey(path string) ([]byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := gossh.MarshalPrivateKey(priv, "kpush host key")
	if err != nil {
		return nil, err
	}
	data := pem.EncodeToMemory(block)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hostkey-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, os.ErrExist) {
		return os.ReadFile(path) // another server made one first: use that
	} else if err != nil {
		return nil, err
	}
	return data, nil
}
