package buildpack

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of build failure. A failed Build returns an *Error whose Kind is one of these, so
// callers tell them apart with errors.Is(err, buildpack.ErrDetect) and friends.
var (
	// ErrDetect: no buildpack group passed detection (lifecycle exit 20 or 21). The app's
	// source is the problem.
	ErrDetect = errors.New("no buildpack could build this app")
	// ErrBuild: a buildpack's bin/build failed (lifecycle exit 51/52), e.g. a compile error.
	// Its output, already written to the build's writer, says why.
	ErrBuild = errors.New("build failed")
	// ErrExport: reading from or publishing to the registry failed (lifecycle analyze or export
	// phase, exit 30-39 or 60-69, or a registry access error).
	ErrExport = errors.New("publishing the image failed")
	// ErrLifecycle: any other failure of the build machinery (sandbox, lifecycle, cache).
	ErrLifecycle = errors.New("the build system failed")
)

// Error is a failed build, worded for the person who pushed. Error() is one line for people;
// Hint, if set, is what to do about it. Kind (one of ErrDetect, ErrBuild, ErrExport,
// ErrLifecycle) is reachable with errors.Is; Err, the underlying cause, with errors.As.
type Error struct {
	Kind     error  // ErrDetect, ErrBuild, ErrExport or ErrLifecycle
	Msg      string // one line for people, e.g. "build failed: see the buildpack output above"
	Hint     string // the one thing to do about it, or ""
	ExitCode int    // the lifecycle's exit code (https://github.com/buildpacks/spec/blob/main/platform.md#exit-codes), or -1 if it did not run
	Detail   string // the lifecycle's last "ERROR:" line, without the prefix, or ""
	Err      error  // the cause (e.g. *exec.ExitError), or nil
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the Kind and the cause, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	errs := []error{e.Kind}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// The lifecycle's exit codes (Platform API 0.14), named as the lifecycle's platform package
// names them: github.com/buildpacks/lifecycle v0.20.4, platform/exit.go (defaultExitCodes;
// the spec: https://github.com/buildpacks/spec/blob/main/platform.md#exit-codes). Copied, not
// imported: the lifecycle module would bring hundreds of modules into kpush's go.mod. Each
// phase owns a range of ten (detect 20-29, analyze 30-39, restore 40-49, build 50-59, export
// 60-69); lifecycleError matches a phase by its range (samePhase), so a code the lifecycle
// adds within a range still counts as that phase's.
const (
	exitFailedDetect           = 20 // platform.FailedDetect: no buildpack group passed detection
	exitFailedDetectWithErrors = 21 // platform.FailedDetectWithErrors: none passed, and at least one errored
	exitAnalyzeError           = 32 // platform.AnalyzeError: generic analyze error
	exitRestoreError           = 42 // platform.RestoreError: generic restore error
	exitBuildError             = 52 // platform.BuildError: generic build error (51, FailedBuildWithErrors: a buildpack's bin/build failed)
	exitExportError            = 62 // platform.ExportError: generic export error
)

// samePhase reports whether exit code code is in the range of the phase whose exit code
// phaseCode is (the same ten: 30-39 for exitAnalyzeError).
func samePhase(code, phaseCode int) bool { return code/10 == phaseCode/10 }

// lifecycleError maps the creator's exit code (the exit* constants) and its last ERROR line
// to an *Error. image is the repository being published, for the message.
func lifecycleError(code int, detail, image string, cause error) *Error {
	e := &Error{ExitCode: code, Detail: detail, Err: cause}
	switch {
	case code == exitFailedDetect || code == exitFailedDetectWithErrors:
		e.Kind, e.Msg = ErrDetect, ErrDetect.Error()
		e.Hint = "add go.mod or a Procfile at the repo root"
		if code == exitFailedDetectWithErrors {
			e.Msg += " (a buildpack's detect step failed with an error, see above)"
		}
	case samePhase(code, exitBuildError):
		e.Kind, e.Msg = ErrBuild, "build failed: see the buildpack output above"
	case samePhase(code, exitAnalyzeError), samePhase(code, exitExportError), mentionsRegistry(detail):
		e.Kind = ErrExport
		e.Msg = fmt.Sprintf("publishing the image to %s failed", image)
		if detail != "" {
			e.Msg += ": " + detail
		}
		e.Hint = "check that the registry is running and reachable, and its credentials"
	case samePhase(code, exitRestoreError):
		e.Kind = ErrLifecycle
		e.Msg = "restoring the build cache failed"
		if detail != "" {
			e.Msg += ": " + detail
		}
		e.Hint = "push again; if it keeps failing, delete the app's build cache"
	default:
		e.Kind = ErrLifecycle
		e.Msg = fmt.Sprintf("the build system failed (lifecycle exit code %d)", code)
		if detail != "" {
			e.Msg += ": " + detail
		}
	}
	return e
}

// mentionsRegistry reports whether a lifecycle error line is about registry access, which the
// lifecycle reports with the generic exit code 1 when it happens before a phase starts.
func mentionsRegistry(detail string) bool {
	d := strings.ToLower(detail)
	return strings.Contains(d, "registry") || strings.Contains(d, "unauthorized") ||
		strings.Contains(d, "connection refused")
}
