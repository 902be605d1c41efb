package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// gcImages pushes to reg what a collection must free and what it must keep: a destroyed
// app's image (its manifest deleted, as apps:destroy does), a layer uploaded for a manifest
// never put (a build killed mid-export), and two releases of a live app: one tagged, one
// only by digest (kpush deploys by digest; a tag is no reason to keep an image).
type gcImages struct {
	gone        v1.Image
	orphan      v1.Hash
	live, older name.Digest
}

func pushGCImages(t *testing.T, reg *Registry) gcImages {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(reg.Keychain())}
	img := func() v1.Image {
		i, err := random.Image(4096, 2)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	digestRef := func(repo string, i v1.Image) name.Digest {
		d, err := i.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.NewDigest(reg.Addr() + "/" + repo + "@" + d.String())
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	var g gcImages
	g.gone = img()
	gone := digestRef("kpush/gone", g.gone)
	if err := remote.Write(gone.Context().Tag("v1"), g.gone, opts...); err != nil {
		t.Fatal(err)
	}
	if err := remote.Delete(gone, opts...); err != nil {
		t.Fatalf("deleting the destroyed app's manifest: %v", err)
	}

	orphan, err := random.Layer(4096, "application/vnd.oci.image.layer.v1.tar")
	if err != nil {
		t.Fatal(err)
	}
	if g.orphan, err = orphan.Digest(); err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(gone.Context(), orphan, opts...); err != nil {
		t.Fatal(err)
	}

	live, older := img(), img()
	g.live, g.older = digestRef("kpush/live", live), digestRef("kpush/live", older)
	if err := remote.Write(g.live.Context().Tag("20250101-000000-abcdef"), live, opts...); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(g.older, older, opts...); err != nil {
		t.Fatal(err)
	}
	return g
}

// blobPath is where distribution's filesystem storage keeps blob h of the registry in
// dataDir.
func blobPath(dataDir string, h v1.Hash) string {
	return filepath.Join(dataDir, "registry", "data", "docker", "registry", "v2", "blobs", h.Algorithm, h.Hex[:2], h.Hex, "data")
}

// imageBlobs are the digests of img's config and layers.
func imageBlobs(t *testing.T, img v1.Image) []v1.Hash {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	out := []v1.Hash{m.Config.Digest}
	for _, l := range m.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// checkCollected fails unless the blobs of g's destroyed image and its orphan layer are gone
// from the disk of dataDir and both live releases pull whole (every layer read back).
func checkCollected(t *testing.T, reg *Registry, dataDir string, g gcImages) {
	t.Helper()
	for _, h := range append(imageBlobs(t, g.gone), g.orphan) {
		if _, err := os.Stat(blobPath(dataDir, h)); !os.IsNotExist(err) {
			t.Errorf("blob %s of a deleted image is still on disk (%v)", h, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, d := range []name.Digest{g.live, g.older} {
		img, err := remote.Image(d, remote.WithContext(ctx), remote.WithAuthFromKeychain(reg.Keychain()))
		if err != nil {
			t.Errorf("release image %s after garbage collection: %v", d, err)
			continue
		}
		if err := validate.Image(img); err != nil { // reads every layer and checks its digest
			t.Errorf("release image %s after garbage collection: %v", d, err)
		}
		if _, err := os.Stat(blobPath(dataDir, imageBlobs(t, img)[1])); err != nil {
			t.Errorf("layer of %s is not on disk: %v", d, err)
		}
	}
}

// TestCollectFreesDeletedImagesAndKeepsEveryRelease: a collection asked for while a build
// holds the registry waits for it; then it frees the blobs of deleted manifests and of
// unreferenced uploads, keeps every other image (tagged or only by digest) whole, and leaves
// the registry answering.
func TestCollectFreesDeletedImagesAndKeepsEveryRelease(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	g := pushGCImages(t, reg)
	for _, h := range imageBlobs(t, g.gone) {
		if _, err := os.Stat(blobPath(data, h)); err != nil {
			t.Fatalf("blob %s of the deleted image is not on disk before the collection: %v", h, err)
		}
	}
	pid := reg.PID()

	release, err := reg.Hold(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = reg.Collect(short)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "waiting for builds") {
		t.Fatalf("Collect while a build holds the registry: %v, want it to wait", err)
	}
	release()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := reg.Collect(ctx)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	t.Logf("garbage collection: %d → %d blobs, %d bytes freed, gc %s, registry paused %s",
		res.BlobsBefore, res.BlobsAfter, res.BytesFreed, res.Duration, res.Paused)
	if res.BlobsAfter >= res.BlobsBefore || res.BytesFreed <= 0 {
		t.Errorf("Collect freed nothing: %+v", res)
	}
	if reg.PID() == pid {
		t.Errorf("the registry process was not stopped for the collection (pid %d)", pid)
	}
	if err := reg.Err(); err != nil {
		t.Errorf("Err() after a collection: %v", err)
	}
	select {
	case <-reg.Done():
		t.Error("Done() closed by a collection's restart")
	default:
	}
	checkCollected(t, reg, data, g)
}

// TestCollectGarbageRunsWhenTheLastHolderLeaves: CollectGarbage returns at once, and the
// collection it asks for runs once the build holding the registry releases it.
func TestCollectGarbageRunsWhenTheLastHolderLeaves(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	g := pushGCImages(t, reg)
	release, err := reg.Hold(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	reg.CollectGarbage()
	if _, err := os.Stat(blobPath(data, g.orphan)); err != nil {
		t.Fatalf("collected while a build held the registry: %v", err)
	}
	release()
	deadline := time.Now().Add(time.Minute)
	for _, err := os.Stat(blobPath(data, g.orphan)); err == nil; _, err = os.Stat(blobPath(data, g.orphan)) {
		if time.Now().After(deadline) {
			t.Fatal("no collection within 1m of the last holder leaving")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A holder arriving now waits for the collection to end, so the registry answers to it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	release, err = reg.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	checkCollected(t, reg, data, g)
}

// TestStartCollectsGarbage: what was deleted while kpush ran is freed when it starts again,
// before the registry serves.
func TestStartCollectsGarbage(t *testing.T) {
	data := t.TempDir()
	reg := startTestRegistry(t, data)
	g := pushGCImages(t, reg)
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	reg = startTestRegistry(t, data)
	checkCollected(t, reg, data, g)
}

// TestCloseRefusesHolds: once closed, the registry hands out no holds and runs no collection.
func TestCloseRefusesHolds(t *testing.T) {
	reg := startTestRegistry(t, t.TempDir())
	reg.Close()
	if _, err := reg.Hold(context.Background()); err != ErrRegistryClosed {
		t.Errorf("Hold after Close: %v, want ErrRegistryClosed", err)
	}
	if _, err := reg.Collect(context.Background()); err != ErrRegistryClosed {
		t.Errorf("Collect after Close: %v, want ErrRegistryClosed", err)
	}
}
