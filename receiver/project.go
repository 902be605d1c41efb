package receiver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/buildpacks/pack/pkg/project"
	"github.com/buildpacks/pack/pkg/project/types"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"

	"kpush.dev/kpush/buildpack"
	"kpush.dev/kpush/internal/names"
	"kpush.dev/kpush/internal/term"
)

// ProjectFile is the project descriptor kpush reads at the root of the pushed tree, as pack
// does (https://buildpacks.io/docs/reference/config/project-descriptor/): schema 0.2
// ([_], [io.buildpacks]) or the legacy 0.1 ([project], [build]).
const ProjectFile = "project.toml"

// projectBuild is what a project descriptor changes about one build.
type projectBuild struct {
	Env   map[string]string // the build env: the descriptor's, overridden by the app's build-env
	Group buildpack.Group   // the build's only group; nil: the builder's order
}

// project applies the project descriptor of the source tree src (see applyProject) with
// the app's build env and the buildpacks p.Builder holds, if it can say (BuildpackLister).
// The error is for people.
func (p *Pipeline) project(log *slog.Logger, src string, buildEnv map[string]string, out io.Writer) (projectBuild, error) {
	var bps []buildpack.GroupEntry
	lister, canList := p.Builder.(BuildpackLister)
	if canList {
		var err error
		if bps, err = lister.Buildpacks(); err != nil {
			log.Error("listing the builder's buildpacks", "err", err)
			return projectBuild{}, errors.New("cannot list the builder's buildpacks; the server log has details")
		}
	}
	pb, err := applyProject(src, buildEnv, bps, canList, out)
	if err != nil {
		log.Info("project.toml refused", "err", err)
	}
	return pb, err
}

// applyProject reads dir/project.toml with pack's parser and applies it to the build of dir:
// it removes the files its include/exclude leave out (see pruneTree), merges its build env
// under appEnv (the app's build-env:set values win) and checks its buildpack group against
// bps, the builder's buildpacks (canList false: the builder cannot say, the group is passed
// on unchecked). It tells out, for people, what it applied. Without a project.toml it
// returns appEnv unchanged and prints nothing. The error is for people: a malformed file
// (pack's message and the line to fix), an unusable group or env name, or a failure to
// prune the tree.
func applyProject(dir string, appEnv map[string]string, bps []buildpack.GroupEntry, canList bool, out io.Writer) (_ projectBuild, err error) {
	// What it prints and refuses quotes the pusher's project.toml: shown escaped.
	tw := term.NewWriter(out)
	defer tw.Flush()
	out = tw
	defer func() {
		if err != nil {
			err = errors.New(term.SanitizeText(err.Error()))
		}
	}()
	pb := projectBuild{Env: cloneEnv(appEnv)}
	d, ok, err := readProject(dir, out)
	if err != nil || !ok {
		return pb, err
	}
	env, n, overridden, err := projectEnv(d, appEnv)
	if err != nil {
		return pb, err
	}
	if n > 0 {
		fmt.Fprintf(out, "-----> project.toml: %d build env var%s", n, plural(n))
		if len(overridden) > 0 {
			fmt.Fprintf(out, " (build-env:set wins for %s)", strings.Join(overridden, ", "))
		}
		fmt.Fprintln(out)
	}
	pb.Env = env
	if pb.Group, err = projectGroup(d, bps, canList); err != nil {
		return pb, err
	}
	if len(pb.Group) > 0 {
		ids := make([]string, len(pb.Group))
		for i, e := range pb.Group {
			ids[i] = e.ID
		}
		fmt.Fprintf(out, "-----> project.toml: buildpack group %s\n", strings.Join(ids, ", "))
	}
	if d.Build.Builder != "" {
		fmt.Fprintf(out, "       project.toml: builder %q ignored; kpush builds with its own builder\n", d.Build.Builder)
	}
	keep, what := projectFilter(d)
	if keep != nil {
		removed, err := pruneTree(dir, keep)
		if err != nil {
			return pb, fmt.Errorf("cannot apply the %s patterns of project.toml: %v", what, err)
		}
		fmt.Fprintf(out, "-----> project.toml: %s left out %d file%s\n", what, removed, plural(removed))
	}
	return pb, nil
}

// readProject reads dir/project.toml with pack's parser (pkg/project, pack v0.36.4), whose
// warnings (unknown keys, no schema version) go to out. ok is false when there is none.
func readProject(dir string, out io.Writer) (d types.Descriptor, ok bool, err error) {
	path := filepath.Join(dir, ProjectFile)
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("cannot read project.toml: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return d, false, errors.New("project.toml is not a regular file (a symlink or a directory); commit the file itself")
	}
	d, err = project.ReadProjectDescriptor(path, &packLogger{out: out})
	if err != nil {
		return d, false, projectError(path, err)
	}
	return d, true, nil
}

// projectError phrases a parse error of pack's for people: the decoder's message, then the
// line to fix when the error says where.
func projectError(path string, err error) error {
	content, _ := os.ReadFile(path)
	msg, line := err.Error(), 0
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg, line = pe.Message, pe.Position.Line
		// The decoder counts an unexpected end of line as the next line's; the byte offset
		// names the line it ends.
		if s := pe.Position.Start; s >= 0 && s < len(content) {
			line = 1 + strings.Count(string(content[:s]), "\n")
		}
	} else if m := tomlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1]) // a type error: "toml: line 5 (last key …): incompatible types …"
	}
	lines := strings.Split(string(content), "\n")
	if line < 1 || line > len(lines) {
		return fmt.Errorf("project.toml is not valid: %s\n !     fix project.toml (%s), commit, and push again", msg, projectDocs)
	}
	return fmt.Errorf("project.toml is not valid: %s\n !     line %d: %s\n !     fix line %d of project.toml, commit, and push again",
		msg, line, strings.TrimSpace(lines[line-1]), line)
}

// tomlLineRE finds the line number in the TOML decoder's type errors.
var tomlLineRE = regexp.MustCompile(`toml: line (\d+)`)

// projectDocs is the project descriptor's reference.
const projectDocs = "https://buildpacks.io/docs/reference/config/project-descriptor/"

// projectEnv returns the build env: d's [[io.buildpacks.build.env]] (or [[build.env]]), a
// later entry of a name winning, overridden by appEnv. n is how many names d sets;
// overridden lists, sorted, the names both set. Error: an entry whose name a buildpack
// cannot receive.
func projectEnv(d types.Descriptor, appEnv map[string]string) (env map[string]string, n int, overridden []string, err error) {
	env = map[string]string{}
	for _, e := range d.Build.Env {
		if !names.IsEnv(e.Name) {
			return nil, 0, nil, fmt.Errorf("project.toml: build env name %q is invalid (letters, digits and '_', not starting with a digit)", e.Name)
		}
		env[e.Name] = e.Value
	}
	n = len(env)
	for k, v := range appEnv {
		if _, ok := env[k]; ok {
			overridden = append(overridden, k)
		}
		env[k] = v
	}
	slices.Sort(overridden)
	return env, n, overridden, nil
}

// projectGroup returns d's buildpack group ([[io.buildpacks.group]] or [[build.buildpacks]])
// as a buildpack.Group, nil when it has none. With canList, each entry must name by id one of
// bps (and, if it gives a version, that version); a uri, an inline script or an unknown id is
// an error naming it and listing bps. [[io.buildpacks.pre.group]] and post groups are refused:
// kpush does not splice them into the builder's order.
func projectGroup(d types.Descriptor, bps []buildpack.GroupEntry, canList bool) (buildpack.Group, error) {
	if len(d.Build.Pre.Buildpacks) > 0 || len(d.Build.Post.Buildpacks) > 0 {
		return nil, errors.New("project.toml: pre and post buildpack groups are not supported; " +
			"list every buildpack in [[io.buildpacks.group]] instead")
	}
	if len(d.Build.Buildpacks) == 0 {
		return nil, nil
	}
	have := map[string]string{}
	var list []string
	for _, bp := range bps {
		have[bp.ID] = bp.Version
		list = append(list, bp.ID+"@"+bp.Version)
	}
	available := "\n !     available buildpacks: " + strings.Join(list, ", ")
	var g buildpack.Group
	for _, bp := range d.Build.Buildpacks {
		name := bp.ID
		if name == "" {
			name = bp.URI
		}
		switch {
		case bp.Script.Inline != "":
			return nil, fmt.Errorf("project.toml: buildpack %s is an inline script; kpush cannot build inline buildpacks", name)
		case bp.URI != "":
			msg := fmt.Sprintf("project.toml: buildpack %s is given by uri; kpush builds only with the builder's buildpacks, by id", name)
			if canList {
				msg += available
			}
			return nil, errors.New(msg)
		}
		if canList {
			v, ok := have[bp.ID]
			if !ok {
				return nil, fmt.Errorf("project.toml: the builder has no buildpack %s%s", bp.ID, available)
			}
			if bp.Version != "" && bp.Version != v {
				return nil, fmt.Errorf("project.toml: buildpack %s@%s is not available; the builder has %s@%s", bp.ID, bp.Version, bp.ID, v)
			}
		}
		g = append(g, buildpack.GroupEntry{ID: bp.ID, Version: bp.Version})
	}
	return g, nil
}

// projectFilter returns whether a file of the tree is built, by its slash-separated path
// relative to the root, as pack decides it (pkg/client getFileFilter): with exclude, files
// no pattern excludes; with include, files a pattern includes. Patterns are gitignore
// lines (go-git's plumbing/format/gitignore; a pattern matching a directory matches all
// below it; a later "!pattern" reverses an earlier match). what names the list applied;
// keep is nil when d has neither.
func projectFilter(d types.Descriptor) (keep func(rel string, isDir bool) bool, what string) {
	compile := func(lines []string) gitignore.Matcher {
		var ps []gitignore.Pattern
		for _, l := range lines {
			if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			ps = append(ps, gitignore.ParsePattern(l, nil))
		}
		return gitignore.NewMatcher(ps)
	}
	split := func(rel string) []string { return strings.Split(rel, "/") }
	switch {
	case len(d.Build.Exclude) > 0:
		m := compile(d.Build.Exclude)
		return func(rel string, isDir bool) bool { return !m.Match(split(rel), isDir) }, "exclude"
	case len(d.Build.Include) > 0:
		m := compile(d.Build.Include)
		return func(rel string, isDir bool) bool { return m.Match(split(rel), isDir) }, "include"
	}
	return nil, ""
}

// pruneTree removes from dir every file and symlink keep rejects, and then every directory
// keep rejects that is left empty, as pack's build context leaves them out (pack decides
// entry by entry: a kept file under a rejected directory stays). It returns how many files
// and symlinks it removed.
func pruneTree(dir string, keep func(rel string, isDir bool) bool) (int, error) {
	removed := 0
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			if !keep(rel, true) {
				dirs = append(dirs, p)
			}
			return nil
		}
		if keep(rel, false) {
			return nil
		}
		removed++
		return os.Remove(p)
	})
	if err != nil {
		return removed, err
	}
	for _, d := range slices.Backward(dirs) { // deepest first
		if ents, err := os.ReadDir(d); err == nil && len(ents) == 0 {
			if err := os.Remove(d); err != nil {
				return removed, err
			}
		}
	}
	return removed, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// packLogger is the logging.Logger pack's parser writes to: its warnings reach the pusher as
// "project.toml: …" lines; debug and info are dropped.
type packLogger struct{ out io.Writer }

func (l *packLogger) Debug(string)              {}
func (l *packLogger) Debugf(string, ...any)     {}
func (l *packLogger) Info(string)               {}
func (l *packLogger) Infof(string, ...any)      {}
func (l *packLogger) Warn(msg string)           { l.line("warning: " + msg) }
func (l *packLogger) Warnf(f string, v ...any)  { l.line("warning: " + fmt.Sprintf(f, v...)) }
func (l *packLogger) Error(msg string)          { l.line("error: " + msg) }
func (l *packLogger) Errorf(f string, v ...any) { l.line("error: " + fmt.Sprintf(f, v...)) }
func (l *packLogger) Writer() io.Writer         { return io.Discard }
func (l *packLogger) IsVerbose() bool           { return false }
func (l *packLogger) line(msg string) {
	if msg = strings.TrimSpace(msg); msg != "" {
		fmt.Fprintf(l.out, "       project.toml: %s\n", msg)
	}
}
