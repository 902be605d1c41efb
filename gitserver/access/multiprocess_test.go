package access

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

// The test binary is also the writer process of TestProcessesSharingADataDirLoseNoChange:
// with childDirEnv set it opens the store there, waits for its stdin to close (so that every
// writer starts together) and adds childCount users, each with a key and a grant.
const (
	childDirEnv    = "KPUSH_ACCESS_TEST_DIR"
	childPrefixEnv = "KPUSH_ACCESS_TEST_PREFIX"
	childCount     = 25
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		if err := runWriter(dir, os.Getenv(childPrefixEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runWriter adds users prefix-0…, each with a key and a read grant on demo, through one Store
// opened before any of them (as a long-running server holds it).
func runWriter(dir, prefix string) error {
	s, err := Open(dir)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		return err
	}
	for i := range childCount {
		name := prefix + "-" + strconv.Itoa(i)
		if _, err := s.AddUser(name, false); err != nil {
			return err
		}
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		k, err := gossh.NewPublicKey(pub)
		if err != nil {
			return err
		}
		if _, err := s.AddKey(name, "k", gossh.MarshalAuthorizedKey(k)); err != nil {
			return err
		}
		if err := s.SetGrant("demo", name, RoleRead); err != nil {
			return err
		}
	}
	return nil
}

// Several kpush processes may share one data dir (README): users, keys and grants that two
// processes add at the same time are all kept, and a Store opened before them (a running
// server's) sees every one of them without being opened again.
func TestProcessesSharingADataDirLoseNoChange(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	if _, err := s.AddUser("root", true); err != nil {
		t.Fatal(err)
	}
	prefixes := []string{"a", "b", "c"}
	var cmds []*exec.Cmd
	var starts []io.WriteCloser
	for _, p := range prefixes {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childDirEnv+"="+dir, childPrefixEnv+"="+p)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		start, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		cmds, starts = append(cmds, cmd), append(starts, start)
		defer func() {
			if t.Failed() && out.Len() > 0 {
				t.Logf("writer %s: %s", p, out.String())
			}
		}()
	}
	for _, st := range starts {
		st.Close()
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("writer %s: %v", prefixes[i], err)
		}
	}

	check := func(what string, s *Store) {
		t.Helper()
		if got, want := len(s.Users()), 1+len(prefixes)*childCount; got != want {
			t.Errorf("%s: %d users, want %d", what, got, want)
		}
		if got, want := len(s.Grants("demo")), len(prefixes)*childCount; got != want {
			t.Errorf("%s: %d grants on demo, want %d", what, got, want)
		}
		var lost []string
		for _, p := range prefixes {
			for i := range childCount {
				name := p + "-" + strconv.Itoa(i)
				keys, err := s.Keys(name)
				if err != nil || len(keys) != 1 || s.Authorize(name, "demo", RoleRead) != nil {
					lost = append(lost, name)
				}
			}
		}
		if len(lost) > 0 {
			t.Errorf("%s: %d of %d users lost their record, key or grant: %s", what, len(lost), len(prefixes)*childCount, strings.Join(lost, " "))
		}
	}
	check("store opened before the writers", s)
	check("store opened after them", openT(t, dir))

	// This process's next change keeps theirs too.
	if err := s.SetGrant("demo", "a-0", RoleAdmin); err != nil {
		t.Fatal(err)
	}
	r := openT(t, dir)
	if len(r.Users()) != 1+len(prefixes)*childCount || r.RoleOf("a-0", "demo") != RoleAdmin {
		t.Errorf("after a change by the first store: %d users, a-0 holds %q on demo", len(r.Users()), r.RoleOf("a-0", "demo"))
	}
}
