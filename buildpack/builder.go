package buildpack

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

//go:embed all:buildpacks
var embedded embed.FS

// Built-in buildpack IDs (Buildpack API 0.10, files under buildpack/buildpacks/).
const (
	GoID       = "kpush/go"       // detects go.mod; compiles the main package with the host Go toolchain
	ProcfileID = "kpush/procfile" // detects Procfile; one /bin/sh -c process per line
)

// GoRootPath is where the build sandbox mounts the host's Go toolchain (read-only); the
// kpush/go buildpack runs GoRootPath/bin/go.
const GoRootPath = "/opt/kpush/go"

// Group is one buildpack group of an order (https://github.com/buildpacks/spec/blob/main/platform.md#ordertoml-toml):
// the lifecycle runs the first group whose non-optional buildpacks all pass detection.
type Group []GroupEntry

// GroupEntry names a buildpack in a Group. Version may be empty: it is filled in from the
// buildpack of that ID that the builder holds.
type GroupEntry struct {
	ID       string
	Version  string
	Optional bool
}

// DefaultOrder is kpush's default order: [kpush/go, kpush/procfile (optional)], then
// [kpush/procfile]. Procfile processes override the Go buildpack's of the same type.
func DefaultOrder() []Group {
	return []Group{
		{{ID: GoID}, {ID: ProcfileID, Optional: true}},
		{{ID: ProcfileID}},
	}
}

// BuiltinBuildpacks returns the files of kpush's own buildpacks, each rooted at the
// buildpack's directory (buildpack.toml, bin/detect, bin/build).
func BuiltinBuildpacks() []fs.FS {
	var out []fs.FS
	for _, name := range []string{"go", "procfile"} {
		sub, err := fs.Sub(embedded, "buildpacks/"+name)
		if err != nil {
			panic(err) // the embedded tree is fixed at compile time
		}
		out = append(out, sub)
	}
	return out
}

// buildpackDescriptor is the part of buildpack.toml the builder reads.
type buildpackDescriptor struct {
	API       string `toml:"api"`
	Buildpack struct {
		ID      string `toml:"id"`
		Version string `toml:"version"`
	} `toml:"buildpack"`
}

// readDescriptor reads buildpack.toml at the root of fsys.
func readDescriptor(fsys fs.FS) (buildpackDescriptor, error) {
	var d buildpackDescriptor
	b, err := fs.ReadFile(fsys, "buildpack.toml")
	if err != nil {
		return d, fmt.Errorf("reading buildpack.toml: %w", err)
	}
	if err := toml.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("parsing buildpack.toml: %w", err)
	}
	if d.Buildpack.ID == "" || d.Buildpack.Version == "" {
		return d, fmt.Errorf("buildpack.toml: [buildpack] id and version are required")
	}
	return d, nil
}

// escapeID is the lifecycle's directory name for a buildpack ID ("kpush/go" → "kpush_go").
func escapeID(id string) string { return strings.ReplaceAll(id, "/", "_") }

// lifecyclePhases are the names the lifecycle binary answers to (it dispatches on argv[0]).
var lifecyclePhases = []string{"creator", "detector", "analyzer", "restorer", "builder", "exporter", "rebaser", "extender"}

// WriteCNB lays out a builder image's /cnb in the directory cnb, as Local lays it out for
// each build: lifecycle/ with empty mount points for the lifecycle and launcher binaries
// (bound read-only over them) and the phase names linked to the lifecycle, plus what
// writeBuilder writes (bps, order.toml from order, run.toml naming runImage). Exported for
// buildpacktest.LocalBuilderImage, which lays out the same /cnb for a build Pod's builder.
func WriteCNB(cnb string, bps []fs.FS, order []Group, runImage string) error {
	if err := os.MkdirAll(filepath.Join(cnb, "lifecycle"), 0o755); err != nil {
		return err
	}
	for _, f := range []string{"lifecycle", "launcher"} {
		if err := os.WriteFile(filepath.Join(cnb, "lifecycle", f), nil, 0o755); err != nil {
			return err
		}
	}
	for _, p := range lifecyclePhases {
		if err := os.Symlink("lifecycle", filepath.Join(cnb, "lifecycle", p)); err != nil {
			return err
		}
	}
	return writeBuilder(cnb, bps, order, runImage)
}

// writeBuilder lays out a builder's /cnb tree in dir: buildpacks/<escaped id>/<version>/ for
// every buildpack in bps, order.toml from order (versions filled in) and run.toml naming
// runImage. It returns an error if order names a buildpack that bps lacks.
func writeBuilder(dir string, bps []fs.FS, order []Group, runImage string) error {
	versions := map[string]string{}
	for _, bp := range bps {
		d, err := readDescriptor(bp)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, "buildpacks", escapeID(d.Buildpack.ID), d.Buildpack.Version)
		if err := copyFS(dst, bp); err != nil {
			return fmt.Errorf("writing buildpack %s: %w", d.Buildpack.ID, err)
		}
		versions[d.Buildpack.ID] = d.Buildpack.Version
	}
	orderTOML, err := renderOrder(order, versions)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "order.toml"), orderTOML, 0o644); err != nil {
		return err
	}
	if err := writeLifecycleSBOMs(filepath.Join(dir, "lifecycle")); err != nil {
		return fmt.Errorf("writing the lifecycle's SBOMs: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "run.toml"), renderRun(runImage), 0o644)
}

// LifecycleVersion is the CNB lifecycle tools/build.sh builds (lifecycle and launcher).
const LifecycleVersion = "0.20.4"

// writeLifecycleSBOMs writes the SBOMs the exporter looks for beside the lifecycle
// (/cnb/lifecycle/{lifecycle,launcher}.sbom.{cdx,spdx,syft}.json, lifecycle phase/exporter.go
// copyDefaultSBOMsForComponent); without them it warns "Did not find SBOM ..." six times per
// build. Each describes the component itself (buildpacks/lifecycle at LifecycleVersion) and
// lists no dependencies: kpush builds it from source and records none.
func writeLifecycleSBOMs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range []string{"lifecycle", "launcher"} {
		purl := "pkg:golang/github.com/buildpacks/lifecycle@v" + LifecycleVersion
		docs := map[string]any{
			// CycloneDX 1.5 JSON.
			"cdx": map[string]any{
				"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
				"metadata":   map[string]any{"component": map[string]any{"type": "application", "name": c, "version": LifecycleVersion, "purl": purl}},
				"components": []any{},
			},
			// SPDX 2.3 JSON.
			"spdx": map[string]any{
				"spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT", "name": c,
				"documentNamespace": "https://kpush.dev/spdx/buildpacks-lifecycle-" + c + "-" + LifecycleVersion,
				"creationInfo":      map[string]any{"created": "2024-01-01T00:00:00Z", "creators": []string{"Tool: kpush"}},
				"packages": []any{map[string]any{"SPDXID": "SPDXRef-Package-" + c, "name": c, "versionInfo": LifecycleVersion,
					"downloadLocation": "NOASSERTION", "externalRefs": []any{map[string]any{
						"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}}}},
			},
			// Syft JSON (schema 16).
			"syft": map[string]any{
				"artifacts": []any{}, "artifactRelationships": []any{},
				"source":     map[string]any{"id": c, "name": c, "version": LifecycleVersion, "type": "file", "metadata": map[string]any{"path": "/cnb/lifecycle/" + c}},
				"distro":     map[string]any{},
				"descriptor": map[string]any{"name": "kpush", "version": LifecycleVersion},
				"schema":     map[string]any{"version": "16.0.0", "url": "https://raw.githubusercontent.com/anchore/syft/main/schema/json/schema-16.0.0.json"},
			},
		}
		for ext, doc := range docs {
			b, err := json.MarshalIndent(doc, "", "  ")
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, c+".sbom."+ext+".json"), append(b, '\n'), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// renderOrder renders order.toml. versions maps the builder's buildpack IDs to versions.
func renderOrder(order []Group, versions map[string]string) ([]byte, error) {
	type entry struct {
		ID       string `toml:"id"`
		Version  string `toml:"version"`
		Optional bool   `toml:"optional,omitempty"`
	}
	type group struct {
		Group []entry `toml:"group"`
	}
	var doc struct {
		Order []group `toml:"order"`
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("the buildpack order is empty")
	}
	for _, g := range order {
		var og group
		for _, e := range g {
			v, ok := versions[e.ID]
			if !ok {
				return nil, fmt.Errorf("order names buildpack %q, which the builder does not have", e.ID)
			}
			if e.Version != "" && e.Version != v {
				return nil, fmt.Errorf("order names buildpack %s@%s, but the builder has version %s", e.ID, e.Version, v)
			}
			og.Group = append(og.Group, entry{ID: e.ID, Version: v, Optional: e.Optional})
		}
		doc.Order = append(doc.Order, og)
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding order.toml: %w", err)
	}
	return buf.Bytes(), nil
}

// renderRun renders run.toml (Platform API 0.12+) with one run image.
func renderRun(runImage string) []byte {
	return fmt.Appendf(nil, "[[images]]\nimage = %q\n", runImage)
}

// copyFS writes the files of fsys under dst. Files under bin/ and files with any execute bit
// become 0755 (embed.FS reports 0444 for everything), others 0644.
func copyFS(dst string, fsys fs.FS) error {
	return fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dst, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: only regular files and directories are supported", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "bin/") || info.Mode()&0o111 != 0 || path.Dir(p) == "bin" {
			mode = 0o755
		}
		return os.WriteFile(target, b, mode)
	})
}
