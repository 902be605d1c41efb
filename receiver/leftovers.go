package receiver

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// processStart is when this process started, as far as leftovers go: what a build of this
// process creates is newer.
var processStart = time.Now()

// RemoveLeftovers removes what builds of a killed kpush left behind: build contexts in
// WorkDir ("kpush-src-<app>-*") and the Builder's scratch directories (when it implements
// RemoveLeftovers). Only entries older than this process's start are candidates, and a build
// context is kept while its app has a pending build run by a live process (Store.OwnerAlive).
// Build contexts are looked for only in an explicit WorkDir: os.TempDir() may be shared with
// kpush processes of other data dirs, whose builds this Store cannot see. Call it once at
// start; it is safe beside running builds of other processes sharing the data dir. Problems
// are logged.
func (p *Pipeline) RemoveLeftovers() {
	log := p.logger()
	if r, ok := p.Builder.(LeftoverRemover); ok {
		removed, err := r.RemoveLeftovers(processStart)
		for _, path := range removed {
			log.Info("removed a leftover build directory", "path", path)
		}
		if err != nil {
			log.Warn("removing leftover build directories", "err", err)
		}
	}
	work := p.WorkDir
	if work == "" {
		return
	}
	live := map[string]bool{} // apps with a pending build of a live process
	if apps, err := p.Store.Apps(); err == nil {
		for _, a := range apps {
			bs, _ := p.Store.Builds(a.Name)
			for _, b := range bs {
				if b.Status == StatusPending && p.Store.OwnerAlive(b.Owner) {
					live[a.Name] = true
				}
			}
		}
	} else {
		log.Warn("listing apps for leftover build contexts", "err", err)
		return
	}
	ents, _ := os.ReadDir(work)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "kpush-src-")
		i := strings.LastIndexByte(rest, '-')
		if !ok || i < 0 || live[rest[:i]] {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(processStart) {
			continue
		}
		path := filepath.Join(work, e.Name())
		if err := os.RemoveAll(path); err != nil {
			log.Warn("removing a leftover build context", "path", path, "err", err)
			continue
		}
		log.Info("removed a leftover build context", "path", path)
	}
}
