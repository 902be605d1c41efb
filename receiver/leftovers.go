package receiver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kpush.dev/kpush/gitserver"
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

// RecoverBranches moves each app's deploy branch to the commit of its current release when a
// killed kpush left it behind: git moves the branch only after the pre-receive hook returned,
// so a kpush killed after the release went live and before git updated the ref leaves the
// branch at the commit the push was made on. The branch is moved only from there (the commit
// of the newest succeeded push before the current release, or absent for a first push), and
// not while a live process runs a release of the app; the pushed commit is in the repository
// already (its release ref keeps it). Call it once at start, with Repos set. Problems are
// logged.
func (p *Pipeline) RecoverBranches() {
	log := p.logger()
	if p.Repos == nil {
		return
	}
	apps, err := p.Store.Apps()
	if err != nil {
		log.Warn("listing apps for deploy branches to recover", "err", err)
		return
	}
	for _, a := range apps {
		if a.Current == 0 || a.DeployBranch == "" {
			continue
		}
		rels, err := p.Store.Releases(a.Name)
		if err != nil {
			log.Warn("reading releases for the deploy branch", "app", a.Name, "err", err)
			continue
		}
		var cur *Release
		old, busy := gitserver.ZeroID, false
		for _, r := range rels { // newest first
			switch {
			case r.Status == StatusPending && p.Store.OwnerAlive(r.Owner):
				busy = true
			case r.Version == a.Current:
				cur = r
			case cur != nil && r.Kind == KindPush && r.Status == StatusSucceeded && old == gitserver.ZeroID:
				old = r.Commit
			}
		}
		if busy || cur == nil || cur.Kind != KindPush || cur.Commit == "" {
			continue // a rollback or config change does not move the branch
		}
		dir, ok := p.Repos.RepoDir(a.Name)
		if !ok {
			continue
		}
		repo, err := gitserver.OpenRepository(dir)
		if err != nil {
			log.Warn("opening the repository for the deploy branch", "app", a.Name, "err", err)
			continue
		}
		branch := "refs/heads/" + a.DeployBranch
		at, err := repo.Ref(branch)
		if err != nil || at == cur.Commit {
			continue
		}
		if at != old {
			log.Warn("deploy branch is at another commit than the current release's", "app", a.Name, "ref", branch,
				"at", at, "release", cur.Version, "commit", cur.Commit)
			continue
		}
		if err := repo.UpdateRef(context.Background(), branch, cur.Commit, old, "kpush: deployed before the server stopped"); err != nil {
			log.Error("moving the deploy branch to the current release's commit", "app", a.Name, "err", err)
			continue
		}
		log.Info("moved the deploy branch to the current release's commit: the server had stopped before git moved it",
			"app", a.Name, "ref", branch, "release", cur.Version, "commit", cur.Commit)
	}
}
