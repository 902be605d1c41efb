package receiver

import (
	"context"
	"io"
	"testing"
)

// TestDestroyForgetsBuildCache: apps:destroy asks the builder to forget the app, so that the
// next app of that name does not start with the destroyed one's cache.
func TestDestroyForgetsBuildCache(t *testing.T) {
	store, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &forgettingBuilder{}
	p := &Pipeline{Store: store, Builder: b}
	if err := store.CreateApp(&App{Name: "demo", Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(context.Background(), "demo", io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(b.forgot) != 1 || b.forgot[0] != "demo" {
		t.Errorf("builder asked to forget %q, want [demo]", b.forgot)
	}
}
