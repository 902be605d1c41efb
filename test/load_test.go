package test

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadApps is how many apps are first pushed, and then cloned, all at once.
const loadApps = 50

// TestDevFiftySimultaneousFirstPushesAndClones: 50 first pushes to 50 apps start at the same
// moment from one address, as a CI farm behind one NAT would push; every one is built,
// deployed and served, and then 50 clones at once get every app back; git fsck is clean on
// every server repository and every clone.
func TestDevFiftySimultaneousFirstPushesAndClones(t *testing.T) {
	// Every connection comes from 127.0.0.1: the default caps on unauthenticated connections
	// (per address and in all) must let 50 handshakes at once through.
	s, httpAddr, env := devServer(t)
	port := httpAddr[strings.LastIndex(httpAddr, ":")+1:]
	dirs, commits := make([]string, loadApps), make([]string, loadApps)
	for i := range loadApps {
		app := fmt.Sprintf("load%02d", i)
		dirs[i] = workTree(t, env, "static")
		commits[i] = commitFile(t, env, dirs[i], "public/index.html", "page "+app+"\n", app)
		git(t, env, dirs[i], "remote", "add", "kpush", s.remote(app))
	}

	go1 := make(chan struct{})
	results := make([]pushResult, loadApps)
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range loadApps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-go1
			results[i] = <-pushBg(env, dirs[i], fmt.Sprintf("load%02d", i), "kpush", "main")
		}()
	}
	close(go1)
	wg.Wait()
	pushes := time.Since(begin)
	var took []time.Duration
	failed := 0
	for i, r := range results {
		took = append(took, r.took)
		if r.code != 0 {
			failed++
			t.Errorf("push of %s exited %d:\n%s", r.name, r.code, r.out)
			continue
		}
		url := "http://" + r.name + ".localhost:" + port + "/"
		if code, body := get(t, httpAddr, url); code != http.StatusOK || body != "page "+r.name+"\n" {
			t.Errorf("GET %s = %d %q, want %s's page", url, code, body, r.name)
		}
		checkRepo(t, dataDirOf(s), r.name, []string{commits[i]})
	}
	slices.Sort(took)
	t.Logf("%d simultaneous first pushes: %d failed; all done in %s; per push median %s, slowest %s",
		loadApps, failed, pushes.Round(100*time.Millisecond), took[len(took)/2].Round(100*time.Millisecond),
		took[len(took)-1].Round(100*time.Millisecond))

	clones := t.TempDir()
	errs := make([]error, loadApps)
	go2 := make(chan struct{})
	begin = time.Now()
	for i := range loadApps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-go2
			dst := filepath.Join(clones, fmt.Sprintf("load%02d", i))
			if out, err := gitResult(env, "", "clone", "-q", s.remote(fmt.Sprintf("load%02d", i)), dst); err != nil {
				errs[i] = fmt.Errorf("git clone: %v\n%s", err, out)
				return
			}
			if head, err := gitResult(env, dst, "rev-parse", "HEAD"); err != nil || strings.TrimSpace(head) != commits[i] {
				errs[i] = fmt.Errorf("the clone's HEAD is %q (%v), want the pushed %s", strings.TrimSpace(head), err, commits[i])
				return
			}
			cmd := exec.Command("git", "fsck", "--strict", "--no-progress")
			cmd.Dir = dst
			if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				errs[i] = fmt.Errorf("git fsck --strict of the clone: %v\n%s", err, out)
			}
		}()
	}
	close(go2)
	wg.Wait()
	failed = 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("clone of load%02d: %v", i, err)
		}
	}
	t.Logf("%d simultaneous clones: %d failed; all done in %s", loadApps, failed, time.Since(begin).Round(100*time.Millisecond))
}
