package lease

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kpush.dev/kpush/deployer/knativetest"
)

// Child processes: the test binary re-executed with childEnv set runs runChild instead of
// the tests.
const (
	childEnv   = "KPUSH_LEASE_CHILD"      // "hold" or "loop"
	childStore = "KPUSH_LEASE_STORE"      // "kube" (with KUBECONFIG, NS) or "file" (with DIR)
	childKube  = "KPUSH_LEASE_KUBECONFIG" //
	childNS    = "KPUSH_LEASE_NS"
	childDir   = "KPUSH_LEASE_DIR"
	childTTL   = "KPUSH_LEASE_TTL"
	childLog   = "KPUSH_LEASE_LOG" // loop: file to append "start/end <pid>" lines to
	childN     = 5                 // loop: critical sections per child
)

func childManager() (*Manager, error) {
	ttl, err := time.ParseDuration(os.Getenv(childTTL))
	if err != nil {
		return nil, err
	}
	switch os.Getenv(childStore) {
	case "kube":
		rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv(childKube))
		if err != nil {
			return nil, err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		return NewKube(cs.CoordinationV1(), os.Getenv(childNS), WithTTL(ttl)), nil
	case "file":
		return NewFile(os.Getenv(childDir), WithTTL(ttl))
	}
	return nil, fmt.Errorf("unknown store %q", os.Getenv(childStore))
}

// runChild: "hold" acquires demo's lease, prints "held <holder>" and sleeps until killed;
// "loop" acquires and releases it childN times, logging each critical section.
func runChild(mode string) int {
	ctx := context.Background()
	m, err := childManager()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch mode {
	case "hold":
		l, err := m.Acquire(ctx, "demo", fmt.Sprintf("pid %d", os.Getpid()), nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("held %s\n", l.Info().Holder)
		select {}
	case "loop":
		f, err := os.OpenFile(os.Getenv(childLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		for range childN {
			l, err := m.Acquire(ctx, "demo", "", nil)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintf(f, "start %d\n", os.Getpid())
			time.Sleep(20 * time.Millisecond)
			fmt.Fprintf(f, "end %d\n", os.Getpid())
			if err := l.Release(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return 0
	}
	return 2
}

type procStore struct {
	name string
	ttl  time.Duration
	// deadAtOnce: a dead holder's lease is free at once, not after its TTL (NewFile: the
	// holder is a process of this host, whose pid is known to be gone).
	deadAtOnce bool
	env        func(t *testing.T) ([]string, func(...Option) *Manager)
}

func procStores() []procStore {
	return []procStore{{
		name: "Kube", ttl: 2 * time.Second,
		env: func(t *testing.T) ([]string, func(...Option) *Manager) {
			ns := knativetest.Namespace(t, cfg)
			kc := knativetest.WriteKubeconfig(t, cfg, ns)
			cs := kubernetes.NewForConfigOrDie(cfg)
			return []string{childStore + "=kube", childKube + "=" + kc, childNS + "=" + ns},
				func(o ...Option) *Manager { return NewKube(cs.CoordinationV1(), ns, o...) }
		},
	}, {
		name: "File", ttl: time.Second, deadAtOnce: true,
		env: func(t *testing.T) ([]string, func(...Option) *Manager) {
			dir := t.TempDir()
			return []string{childStore + "=file", childDir + "=" + dir}, func(o ...Option) *Manager {
				m, err := NewFile(dir, o...)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
		},
	}}
}

func child(t *testing.T, mode string, ttl time.Duration, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, childEnv+"="+mode, childTTL+"="+ttl.String())...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestKilledHolder: a child process holds the lease and is killed with SIGKILL (no release,
// no cleanup); this process, a new holder, gets the lease once the child's last renewal is a
// TTL old: not before, and not much later — except with the file store, where the dead
// child's lease is free at once (its pid is gone from this host).
func TestKilledHolder(t *testing.T) {
	for _, ps := range procStores() {
		t.Run(ps.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			env, newLocker := ps.env(t)
			cmd := child(t, "hold", ps.ttl, env)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "held ") {
				t.Fatalf("child said %q, %v; want held <holder>", line, err)
			}
			childHolder := strings.TrimSpace(strings.TrimPrefix(line, "held "))
			time.Sleep(ps.ttl / 2) // let it renew at least once
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			m := newLocker(WithTTL(ps.ttl))
			stored, held, err := m.Holder(ctx, "demo")
			if err != nil || stored.Holder != childHolder {
				t.Fatalf("after the kill, Holder = %+v, %v, %v; want the child %s", stored, held, err, childHolder)
			}
			l := acquire(ctx, t, m, "demo", "after kill -9")
			defer l.Release(ctx)
			got := l.Info()
			expiry := stored.Renewed.Add(stored.TTL)
			if ps.deadAtOnce {
				if held || !got.Acquired.Before(expiry) {
					t.Errorf("dead child's lease: held=%v, acquired at %v; want free at once, before its TTL ran out at %v", held, got.Acquired, expiry)
				}
			} else if got.Acquired.Before(expiry) {
				t.Errorf("acquired at %v, before the killed holder's lease expired at %v", got.Acquired, expiry)
			}
			if got.Acquired.After(expiry.Add(time.Second)) {
				t.Errorf("acquired at %v, more than 1 s after the killed holder's lease expired at %v", got.Acquired, expiry)
			}
			if got.Holder == childHolder || !strings.Contains(got.Holder, fmt.Sprintf("_%d_", os.Getpid())) {
				t.Errorf("new holder %q: want this process's identity, not the child's %q", got.Holder, childHolder)
			}
		})
	}
}

// TestTwoProcesses: two child processes take the lease in turns childN times each; their
// critical sections, logged to one file, never overlap.
func TestTwoProcesses(t *testing.T) {
	for _, ps := range procStores() {
		t.Run(ps.name, func(t *testing.T) {
			t.Parallel()
			env, _ := ps.env(t)
			logPath := filepath.Join(t.TempDir(), "sections.log")
			env = append(env, childLog+"="+logPath)
			a, b := child(t, "loop", ps.ttl, env), child(t, "loop", ps.ttl, env)
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			if err := b.Start(); err != nil {
				_ = a.Process.Kill()
				t.Fatal(err)
			}
			errA, errB := a.Wait(), b.Wait()
			if errA != nil || errB != nil {
				t.Fatalf("children: %v, %v", errA, errB)
			}
			data, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Fields(strings.ReplaceAll(string(data), "\n", " "))
			if len(lines) != 2*2*2*childN {
				t.Fatalf("log has %d words, want %d:\n%s", len(lines), 8*childN, data)
			}
			pids := map[string]int{}
			for i := 0; i < len(lines); i += 4 {
				if lines[i] != "start" || lines[i+2] != "end" || lines[i+1] != lines[i+3] {
					t.Fatalf("critical sections overlap at line %d:\n%s", i/2+1, data)
				}
				pids[lines[i+1]]++
			}
			if len(pids) != 2 {
				t.Errorf("sections by %d processes, want 2: %v", len(pids), pids)
			}
		})
	}
}
