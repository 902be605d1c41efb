package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Garbage collection of the dev registry.
//
// Deleting a manifest (apps:destroy does, for every image of the app) only unlinks it; its
// layers stay on disk until distribution's offline `registry garbage-collect` sweeps every
// blob no remaining manifest references. That sweep is safe only while nothing writes: a
// layer uploaded for a manifest not yet put looks unreferenced and would be swept under it.
// So kpush runs it when no build or deploy holds the registry (Hold), with the registry
// process stopped, and starts the process again afterwards: on every start (StartRegistry,
// before the process runs) and after each apps:destroy (CollectGarbage).
//
// It runs without --delete-untagged. kpush deploys and rolls back by digest: a release's
// image needs no tag to stay, and the sweep keeps every manifest that was not deleted,
// tagged or not, with all the blobs it references. The only manifests kpush deletes are
// those of a destroyed app, so every image of every live release (the one serving and each
// older one a rollback may return to) survives a collection.

// ErrRegistryClosed is returned by Hold and Collect once Close has begun.
var ErrRegistryClosed = errors.New("the registry is closed")

// gcGate lets any number of holders (builds, deploys) use the registry at once, and a
// garbage collection run only when none does; holders that come meanwhile wait for it. A
// collection waits for every holder to leave, however many come, so that a push never
// waits behind a collection waiting for another push: dev mode's collections can wait.
type gcGate struct {
	holds   int
	running bool          // a collection runs
	pending bool          // CollectGarbage asked for one that has not started
	closed  bool          // Close began: no collection starts any more
	changed chan struct{} // closed and replaced whenever the fields above change
}

// broadcast wakes everything waiting for the gate to change. Under Registry.mu.
func (g *gcGate) broadcast() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// GCResult is what a garbage collection freed and how long it took.
type GCResult struct {
	BlobsBefore, BlobsAfter int   // blobs in the storage
	BytesFreed              int64 // size of the blobs swept
	Duration                time.Duration
	Paused                  time.Duration // how long the registry did not answer (zero before the start)
}

// Hold keeps garbage collection from starting until release is called, waiting for a
// collection that runs to end first. Builds and deploys hold the registry while they use it.
// release may be called more than once.
func (r *Registry) Hold(ctx context.Context) (release func(), err error) {
	r.mu.Lock()
	for r.gate.running {
		ch := r.gate.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the registry's garbage collection: %w", context.Cause(ctx))
		}
		r.mu.Lock()
	}
	if r.gate.closed {
		r.mu.Unlock()
		return nil, ErrRegistryClosed
	}
	r.gate.holds++
	r.gate.broadcast()
	r.mu.Unlock()
	released := false
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !released {
			released = true
			r.gate.holds--
			r.gate.broadcast()
		}
	}, nil
}

// CollectGarbage asks for a garbage collection and returns at once: it runs as soon as
// nothing holds the registry (Collect). Requests made before it starts are served by it.
func (r *Registry) CollectGarbage() {
	r.mu.Lock()
	if r.gate.pending || r.gate.closed {
		r.mu.Unlock()
		return
	}
	r.gate.pending = true
	r.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		if _, err := r.Collect(ctx); err != nil && !errors.Is(err, ErrRegistryClosed) {
			r.log.Error("registry garbage collection failed", "err", err, "log", r.logPath)
		}
	}()
}

// Collect waits until nothing holds the registry, then stops the registry process, runs
// `registry garbage-collect` on its storage and starts the process again, holding off Hold
// meanwhile. When the process does not start again the registry has stopped for good (Err).
func (r *Registry) Collect(ctx context.Context) (GCResult, error) {
	r.mu.Lock()
	for !r.gate.closed && (r.gate.running || r.gate.holds > 0) {
		ch := r.gate.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return GCResult{}, fmt.Errorf("waiting for builds to stop using the registry: %w", context.Cause(ctx))
		}
		r.mu.Lock()
	}
	if r.gate.closed {
		r.mu.Unlock()
		return GCResult{}, ErrRegistryClosed
	}
	r.gate.running, r.gate.pending = true, false
	r.gate.broadcast()
	p := r.proc
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.gate.running = false
		r.gate.broadcast()
		r.mu.Unlock()
	}()
	if err := r.Err(); err != nil {
		return GCResult{}, err
	}

	paused := time.Now()
	r.mu.Lock()
	p.paused = true
	r.mu.Unlock()
	r.stopProcess(p)
	res, gcErr := r.garbageCollect(ctx)
	logStart, err := r.startProcess()
	if err == nil {
		if err = r.waitReady(ctx); err != nil {
			err = fmt.Errorf("%w\nlast log lines:\n%s", err, lastLines(r.logPath, logStart, 15))
		}
	}
	if err != nil {
		err = fmt.Errorf("starting the registry again after garbage collection: %w", err)
		r.mu.Lock()
		p := r.proc
		p.paused = true // its exit is reported here, once
		r.mu.Unlock()
		r.stopProcess(p)
		r.stopped(err)
		return res, err
	}
	res.Paused = time.Since(paused)
	r.log.Info("registry paused for garbage collection", "paused", res.Paused)
	return res, gcErr
}

// garbageCollect runs `registry garbage-collect` on the storage of r's configuration (the
// process must not be running) and logs what it freed. Its output goes to r.logPath.
func (r *Registry) garbageCollect(ctx context.Context) (GCResult, error) {
	start := time.Now()
	v2 := filepath.Join(r.dir, "data", "docker", "registry", "v2")
	blobs := filepath.Join(v2, "blobs")
	var res GCResult
	if _, err := os.Stat(filepath.Join(v2, "repositories")); errors.Is(err, fs.ErrNotExist) {
		return res, nil // nothing was ever pushed (garbage-collect fails on a store without repositories)
	}
	var before int64
	res.BlobsBefore, before = blobUsage(blobs)
	logf, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return res, fmt.Errorf("opening registry log: %w", err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, r.bin, "garbage-collect", r.confPath)
	cmd.Dir = r.dir
	cmd.Env = registryEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("registry garbage-collect: %w (see %s)", err, r.logPath)
	}
	var after int64
	res.BlobsAfter, after = blobUsage(blobs)
	res.BytesFreed, res.Duration = before-after, time.Since(start)
	r.log.Info("registry garbage collected", "blobs_before", res.BlobsBefore, "blobs_after", res.BlobsAfter,
		"bytes_freed", res.BytesFreed, "duration", res.Duration)
	return res, nil
}

// blobUsage counts the blobs under dir (distribution's filesystem layout:
// blobs/sha256/<2 hex>/<hex>/data) and their size.
func blobUsage(dir string) (n int, size int64) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() == "data" {
			if fi, err := d.Info(); err == nil {
				n, size = n+1, size+fi.Size()
			}
		}
		return nil
	})
	return n, size
}
