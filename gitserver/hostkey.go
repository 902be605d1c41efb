package gitserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	gossh "golang.org/x/crypto/ssh"

	"kpush.dev/kpush/internal/atomicfile"
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
	if err := atomicfile.Create(path, data, 0o600); errors.Is(err, os.ErrExist) {
		return os.ReadFile(path) // another server made one first: use that
	} else if err != nil {
		return nil, err
	}
	return data, nil
}
