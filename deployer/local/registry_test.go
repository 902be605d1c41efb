package local

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestRegistryKeepsImageAcrossRestart(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	addr := reg.Addr()
	ref := pushAppImage(t, addr, "demo", appImage{index: "kept"})

	// A second registry on the same data dir is refused while the first runs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r2, err := StartRegistry(ctx, RegistryConfig{DataDir: data}); err == nil {
		r2.Close()
		t.Fatal("second registry on the same data dir started")
	} else if !strings.Contains(err.Error(), "in use") {
		t.Errorf("second registry: %v, want an in-use error", err)
	}

	if err := reg.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if processGone(reg.PID()) == false {
		t.Errorf("registry pid %d survives Close", reg.PID())
	}
	reg2 := startTestRegistry(t, data)
	if reg2.Addr() != addr {
		t.Fatalf("restarted registry on %s, want the persisted %s", reg2.Addr(), addr)
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(d, remote.WithContext(ctx)); err != nil {
		t.Fatalf("image pushed before the restart is gone: %v", err)
	}
	if err := reg2.Err(); err != nil {
		t.Errorf("Err() of a running registry: %v", err)
	}
}

func TestRegistryReportsDeath(t *testing.T) {
	reg := startTestRegistry(t, t.TempDir())
	if err := reg.cmd.Process.Kill(); err != nil { // a crash the real registry cannot be asked for
		t.Fatal(err)
	}
	<-reg.Done()
	if err := reg.Err(); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("Err() after the process died: %v", err)
	}
}
