package buildpack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/BurntSushi/toml"

	"kpush.dev/kpush/internal/sandbox"
)

// prepare creates the per-build directory tree (see Local) with order as the builder's
// order.toml, and the app's cache directory, and chowns the source to the CNB user.
func (l *Local) prepare(build, cacheDir, source, runImage string, order []Group, env map[string]string, ids sandbox.IDRange) error {
	for _, d := range []string{"cnb/lifecycle", "layers", "platform/env", "home", cacheDir} {
		p := d
		if !filepath.IsAbs(p) {
			p = filepath.Join(build, d)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	bps := append(BuiltinBuildpacks(), l.ExtraBuildpacks...)
	if err := WriteCNB(filepath.Join(build, "cnb"), bps, order, runImage); err != nil {
		return err
	}
	for k, v := range env {
		if err := os.WriteFile(filepath.Join(build, "platform", "env", k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:CNB user:/home/%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		CNBUser, CNBUserID, CNBGroupID, CNBUser)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", CNBUser, CNBGroupID)
	if err := os.WriteFile(filepath.Join(build, "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(build, "group"), []byte(group), 0o644); err != nil {
		return err
	}
	if err := writeEtc(build); err != nil {
		return err
	}
	for _, d := range []string{"control", "restore"} {
		if err := os.Mkdir(filepath.Join(build, d), 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(build, "analyzed.toml"), nil, 0o644); err != nil {
		return err
	}
	uid, gid := int(ids.Host(CNBUserID)), int(ids.Host(CNBGroupID))
	for _, d := range []string{"home", "layers", "control", "restore"} {
		if err := os.Lchown(filepath.Join(build, d), uid, gid); err != nil {
			return err
		}
	}
	// The cache keeps its owner between builds; a cache from before the app had its own
	// host ids (or restored from elsewhere) is handed over once.
	if fi, err := os.Stat(cacheDir); err != nil {
		return err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || int(st.Gid) != gid {
		if err := chownTree(cacheDir, uid, gid); err != nil {
			return err
		}
	}
	return chownTree(source, uid, gid)
}

// chownTree gives every file under dir (dir included, symlinks themselves) to uid:gid.
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// writeEtc writes the build sandbox's /etc files into the build directory: hosts, and
// resolv.conf twice: resolv.conf.outbound (slirp4netns's resolver, for the phases that run
// buildpacks) and resolv.conf.host (the host's resolvers, for the lifecycle's registry
// phases on the host's network). The host's own /etc stays out of every phase.
func writeEtc(build string) error {
	hostResolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for name, data := range map[string]string{
		"hosts":                "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
		"resolv.conf.outbound": "nameserver " + sandbox.SlirpDNS + "\n",
		"resolv.conf.host":     string(hostResolv),
	} {
		if err := os.WriteFile(filepath.Join(build, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// buildSandbox is what every lifecycle phase of one build mounts and runs as.
type buildSandbox struct {
	build     string // per-build directory (cnb/, layers/, platform/, home/, passwd, group, hosts, resolv.conf.*)
	source    string // → /workspace
	cache     string // → /cache
	goRoot    string // → GoRootPath
	lifecycle string // → /cnb/lifecycle/lifecycle
	launcher  string // → /cnb/lifecycle/launcher
	ids       sandbox.IDRange
	auth      string // CNB_REGISTRY_AUTH, for the phases that talk to the registry; "" = none
	stdout    io.Writer
	stderr    io.Writer
}

// phase is one lifecycle phase run in a sandbox of its own.
type phase struct {
	name   string   // the lifecycle binary (/cnb/lifecycle/<name>)
	header string   // the line the creator prints before it, e.g. "===> DETECTING"
	args   []string // its flags and arguments
	// registry: the phase talks to the registry (analyze, restore, export). It alone gets the
	// credentials and the host's network, and never runs buildpack code.
	registry bool
	// buildpacks: the phase runs buildpack code (detect, build): no credentials, its own
	// network (build: outbound only, no host loopback; detect: none), the CNB user's $HOME.
	network   sandbox.Network
	workspace bool // /workspace writable (build)
	platform  bool // /platform mounted (detect, build)
	home      bool // /home/cnb mounted (detect, build)
	cache     bool // /cache mounted (restore, export)
	cacheRW   bool // read-write
	goRoot    bool // the Go toolchain at GoRootPath (detect, build)
}

// phases are the lifecycle's five phases as kpack runs them (Platform API 0.14): analyze,
// detect, restore, build, export, each in its own sandbox, so that the registry credentials
// reach only analyze, restore and export, which run no buildpack code. previous (if not "")
// is -previous-image, the image whose layers the export may reuse.
func phases(image, previous string, insecure []string) []phase {
	const (
		analyzed = "-analyzed=" + controlDir + "/analyzed.toml"
		group    = "-group=/layers/group.toml"
		plan     = "-plan=/layers/plan.toml"
	)
	reg := func(a []string) []string {
		for _, r := range insecure {
			a = append(a, "-insecure-registry="+r)
		}
		return a
	}
	analyze := []string{"-layers=/layers", analyzed, "-run=/cnb/run.toml"}
	if previous != "" {
		analyze = append(analyze, "-previous-image="+previous)
	}
	return []phase{
		{name: "analyzer", header: "===> ANALYZING", registry: true, network: sandbox.NetHost,
			args: append(reg(analyze), image)},
		{name: "detector", header: "===> DETECTING", network: sandbox.NetNone, platform: true, home: true, goRoot: true,
			args: []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
				"-buildpacks=/cnb/buildpacks", "-order=/cnb/order.toml", analyzed, group, plan}},
		{name: "restorer", header: "===> RESTORING", registry: true, network: sandbox.NetHost, cache: true, cacheRW: true, // it stages in the cache
			args: reg([]string{"-layers=/layers", "-cache-dir=/cache", analyzed, group})},
		{name: "builder", header: "===> BUILDING", network: sandbox.NetOutbound, workspace: true, platform: true, home: true, goRoot: true,
			args: []string{"-app=/workspace", "-layers=/layers", "-platform=/platform",
				"-buildpacks=/cnb/buildpacks", analyzed, group, plan}},
		{name: "exporter", header: "===> EXPORTING", registry: true, network: sandbox.NetHost, cache: true, cacheRW: true,
			args: append(reg([]string{"-app=/workspace", "-layers=/layers", "-cache-dir=/cache",
				"-launcher=/cnb/lifecycle/launcher", "-report=" + controlDir + "/report.toml", "-run=/cnb/run.toml",
				analyzed, group, "-parallel"}), image)},
	}
}

// spec is ph's sandbox: the host's /usr (programs and libraries) and a generated /etc,
// read-only; the builder at /cnb; /layers; and only the rest ph needs (see phase).
func (b *buildSandbox) spec(ph phase) sandbox.Spec {
	m := sandbox.HostSystemMounts()
	resolv := "resolv.conf.outbound"
	if ph.network == sandbox.NetHost {
		resolv = "resolv.conf.host"
	}
	m = append(m,
		sandbox.Mount{Source: filepath.Join(b.build, "passwd"), Dest: "/etc/passwd"},
		sandbox.Mount{Source: filepath.Join(b.build, "group"), Dest: "/etc/group"},
		sandbox.Mount{Source: filepath.Join(b.build, "hosts"), Dest: "/etc/hosts"},
		sandbox.Mount{Source: filepath.Join(b.build, resolv), Dest: "/etc/resolv.conf"},
	)
	if _, err := os.Stat(hostCABundle); err == nil {
		m = append(m, sandbox.Mount{Source: hostCABundle, Dest: hostCABundle})
	}
	m = append(m,
		sandbox.Mount{Dest: "/tmp", Size: 1 << 30}, // compilers' scratch space
		sandbox.Mount{Source: filepath.Join(b.build, "cnb"), Dest: "/cnb"},
		sandbox.Mount{Source: b.lifecycle, Dest: "/cnb/lifecycle/lifecycle"},
		sandbox.Mount{Source: b.launcher, Dest: "/cnb/lifecycle/launcher"},
		sandbox.Mount{Source: filepath.Join(b.build, "layers"), Dest: "/layers", Writable: true},
	)
	switch {
	case ph.name == "restorer":
		// The restorer writes restored cache layers into /layers, through whatever symlinks
		// buildpack code left there: it gets a copy of analyzed.toml of its own, which kpush
		// checks against analyze's before the export sees it (takeRestored).
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "restore"), Dest: controlDir, Writable: true})
	case ph.registry:
		// analyzed.toml (the run and previous image the export uses) and report.toml (the
		// digest kpush deploys) live where no phase that runs buildpack code can write.
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "control"), Dest: controlDir, Writable: true})
	default:
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "analyzed.toml"), Dest: controlDir + "/analyzed.toml"})
	}
	if ph.name != "analyzer" && ph.name != "restorer" {
		m = append(m, sandbox.Mount{Source: b.source, Dest: "/workspace", Writable: ph.workspace})
	}
	if ph.platform {
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "platform"), Dest: "/platform"})
	}
	if ph.home {
		m = append(m, sandbox.Mount{Source: filepath.Join(b.build, "home"), Dest: "/home/" + CNBUser, Writable: true})
	}
	if ph.cache {
		m = append(m, sandbox.Mount{Source: b.cache, Dest: "/cache", Writable: ph.cacheRW})
	}
	if ph.goRoot {
		m = append(m, sandbox.Mount{Source: b.goRoot, Dest: GoRootPath})
	}
	env := []string{
		"PATH=" + GoRootPath + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/home/" + CNBUser,
		"CNB_PLATFORM_API=" + PlatformAPI,
		"CNB_USER_ID=" + strconv.Itoa(CNBUserID),
		"CNB_GROUP_ID=" + strconv.Itoa(CNBGroupID),
		"CNB_NO_COLOR=true",
		"TERM=dumb",
		"LANG=C.UTF-8",
	}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if ph.registry && b.auth != "" {
		env = append(env, "CNB_REGISTRY_AUTH="+b.auth)
	}
	dir := "/workspace"
	if ph.name == "analyzer" || ph.name == "restorer" {
		dir = "/layers"
	}
	return sandbox.Spec{
		Argv:     append([]string{"/cnb/lifecycle/" + ph.name, "-log-level=info", "-no-color"}, ph.args...),
		Env:      env,
		Dir:      dir,
		Hostname: "kpush-build",
		Mounts:   m,
		HostIDs:  b.ids, UID: CNBUserID, GID: CNBGroupID,
		Network:    ph.network,
		NewSession: true,
		// The registry phases read files buildpack code wrote (/layers): with no /proc, no
		// symlink there can lead them to their own environment and its credentials.
		NoProc: ph.registry,
		Stdout: b.stdout, Stderr: b.stderr,
	}
}

// hostCABundle is the host's CA bundle (Debian's path, which Go and OpenSSL read), given to
// build sandboxes so buildpacks can verify the package registries they download from.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

func (b *buildSandbox) run(ctx context.Context, ph phase) error {
	return sandbox.Run(ctx, b.spec(ph))
}

// controlDir is where the registry phases keep analyzed.toml and report.toml: <build>/control,
// mounted only into analyze, restore and export (trusted lifecycle code); detect and build get
// a read-only copy of analyzed.toml there, which kpush refreshes after each registry phase.
const controlDir = "/kpush"

// maxControlFile bounds what kpush reads of a lifecycle control file.
const maxControlFile = 1 << 20

// readControlFile returns the regular file name of the build's control directory, never
// following a symlink, at most maxControlFile bytes.
func readControlFile(build, name string) ([]byte, error) {
	return readBuildFile(build, "control", name)
}

// readBuildFile returns the regular file dir/name of the build directory, never following a
// symlink, never blocking on a FIFO, at most maxControlFile bytes.
func readBuildFile(build, dir, name string) ([]byte, error) {
	root, err := os.OpenRoot(filepath.Join(build, dir))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if fi, err := root.Lstat(name); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxControlFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxControlFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, maxControlFile)
	}
	return b, nil
}

// publishAnalyzed copies the control directory's analyzed.toml (as analyze or restore left it)
// to the read-only copy the phases that run buildpacks see.
func publishAnalyzed(build string) error {
	b, err := readControlFile(build, "analyzed.toml")
	if err != nil {
		return fmt.Errorf("reading analyzed.toml: %w", err)
	}
	// Rewritten in place: it is the source of a bind mount the next phase makes.
	return os.WriteFile(filepath.Join(build, "analyzed.toml"), b, 0o644)
}

// giveRestorer copies analyze's analyzed.toml into the restorer's own directory, owned by the
// CNB user (the restorer rewrites it).
func giveRestorer(build string, ids sandbox.IDRange) error {
	b, err := readControlFile(build, "analyzed.toml")
	if err != nil {
		return fmt.Errorf("reading analyzed.toml: %w", err)
	}
	p := filepath.Join(build, "restore", "analyzed.toml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return err
	}
	return os.Lchown(p, int(ids.Host(CNBUserID)), int(ids.Host(CNBGroupID)))
}

// takeRestored accepts the restorer's analyzed.toml into the control directory (for the
// export) if it names the same run image and previous image as analyze's: the restorer
// writes through symlinks buildpack code planted in /layers, so what it wrote is checked.
func takeRestored(build string) error {
	restored, err := readBuildFile(build, "restore", "analyzed.toml")
	if err != nil {
		return fmt.Errorf("reading the restorer's analyzed.toml: %w", err)
	}
	analyzed, err := readControlFile(build, "analyzed.toml")
	if err != nil {
		return fmt.Errorf("reading analyzed.toml: %w", err)
	}
	a, err := imagesOf(analyzed)
	if err != nil {
		return fmt.Errorf("analyze's analyzed.toml: %w", err)
	}
	r, err := imagesOf(restored)
	if err != nil {
		return fmt.Errorf("the restorer's analyzed.toml: %w", err)
	}
	if a != r {
		return fmt.Errorf("the restore phase changed the images of analyzed.toml (run image %q, previous image %q; analyze found %q, %q)",
			r.run, r.previous, a.run, a.previous)
	}
	return os.WriteFile(filepath.Join(build, "control", "analyzed.toml"), restored, 0o644)
}

// analyzedImages are the images an analyzed.toml bases the export on.
type analyzedImages struct{ run, previous string }

func imagesOf(b []byte) (analyzedImages, error) {
	var md struct {
		Image struct {
			Reference string `toml:"reference"`
		} `toml:"image"`
		RunImage struct {
			Reference string `toml:"reference"`
			Image     string `toml:"image"`
		} `toml:"run-image"`
	}
	if _, err := toml.Decode(string(b), &md); err != nil {
		return analyzedImages{}, err
	}
	return analyzedImages{run: md.RunImage.Reference + " " + md.RunImage.Image, previous: md.Image.Reference}, nil
}
