package test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// timedLine is one line of `git push` output and when it arrived.
type timedLine struct {
	at   time.Time
	text string
}

// pushTimed runs `git push` in dir and returns its output lines, each with the time it was
// read, and the exit code.
func pushTimed(t *testing.T, env []string, dir string, args ...string) ([]timedLine, int) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"push"}, args...)...)
	cmd.Dir, cmd.Env = dir, env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = os.Stderr // git push writes its output to stderr; stdout stays empty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []timedLine
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		lines = append(lines, timedLine{time.Now(), sc.Text()})
	}
	code := 0
	if err := cmd.Wait(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return lines, code
}

var stillBuildingRE = regexp.MustCompile(`^remote: -----> still building \((\d+m)?\d+s\)$`)

// TestSilentBuildStepShowsProgress pushes an app whose build step prints nothing for 45 s
// (the quiet buildpack): the push shows a "still building" line at least every 20 s, so
// neither the person nor a load balancer in front of SSH sees an idle connection.
func TestSilentBuildStepShowsProgress(t *testing.T) {
	quiet, err := filepath.Abs(filepath.Join("testdata", "buildpacks", "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	s, _, env := devServer(t, "--buildpack", quiet)
	dir := workTree(t, env, "static")
	if err := os.WriteFile(filepath.Join(dir, "quiet"), []byte("45\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, env, dir, "add", "quiet")
	git(t, env, dir, "commit", "-q", "-m", "quiet")
	git(t, env, dir, "remote", "add", "knative", s.remote("static"))
	lines, code := pushTimed(t, env, dir, "knative", "main")
	var all strings.Builder
	for _, l := range lines {
		all.WriteString(l.at.Format("15:04:05.000 ") + l.text + "\n")
	}
	if code != 0 {
		t.Fatalf("git push exited %d:\n%s", code, all.String())
	}
	from, to := -1, -1
	for i, l := range lines {
		switch {
		case strings.Contains(l.text, "quiet: silent for 45s"):
			from = i
		case strings.Contains(l.text, "quiet: done"):
			to = i
		}
	}
	if from < 0 || to < from {
		t.Fatalf("the quiet step's lines are missing:\n%s", all.String())
	}
	if took := lines[to].at.Sub(lines[from].at); took < 45*time.Second {
		t.Fatalf("the quiet step took %s, less than its 45s:\n%s", took, all.String())
	}
	progress := 0
	for i := from + 1; i <= to; i++ {
		if gap := lines[i].at.Sub(lines[i-1].at); gap > 21*time.Second {
			t.Errorf("%s without a line before %q", gap.Round(time.Millisecond), lines[i].text)
		}
		if i < to {
			// git pads "remote:" lines with spaces that clear the rest of the terminal line.
			if !stillBuildingRE.MatchString(strings.TrimRight(lines[i].text, " ")) {
				t.Errorf("line %q during the silent step, want only progress lines", lines[i].text)
			}
			progress++
		}
	}
	if progress < 2 {
		t.Errorf("%d progress lines during 45s of silence, want at least 2", progress)
	}
	mustContain(t, all.String(), "remote: -----> Released static v1")
	t.Logf("git push:\n%s", all.String())
}
