// Package upstream puts dispatch inside kube-scheduler: it materialises a
// copy of k8s.io/kubernetes whose pkg/scheduler/backend/api_dispatcher is
// the drop-in of this module's apidispatcher package, for building
// kube-scheduler with it and running upstream's own tests against it.
//
// Go cannot overlay files of a module in the module cache (go build
// -overlay refuses them), so the package is replaced in a copy: Materialise
// copies k8s.io/kubernetes at Version from the module cache into a cache
// directory, puts the drop-in in the package, and makes the copy usable
// both as a replacement (a consumer's `replace k8s.io/kubernetes => DIR`)
// and as a main module of its own (to run upstream's tests in it). The
// command cmd/materialise does the same and prints what a consumer's go.mod
// or go.work needs.
//
// Upstream's own non-test files of the package, and its tests of their
// private types (call_queue_test.go, goroutines_limiter_test.go), stay in
// the copy behind the build tag dispatch_upstream: a default build has the
// drop-in and nothing else; a build with -tags dispatch_upstream has
// upstream's package exactly. So one copy builds kube-scheduler both ways,
// from the same sources, and the two builds share every compiled package
// that does not depend on the dispatcher. A third tag, dispatch_gate_on,
// turns the SchedulerAsyncAPICalls feature gate on by default (it is off by
// default in this release), to run upstream's tests with it on. A fourth,
// dispatch_perf_client (PerfClientTag), gives scheduler_perf's scheduler a
// client at its configuration's QPS and burst, as kube-scheduler's has, for
// the storm of kubernetes#135900 as a scheduler_perf workload. A fifth,
// LimiterTag, with BaselineTag, builds a model of kubernetes#142123
// instead of upstream's package: upstream's dispatcher with a limiter of
// the failure handler's status patches (see limitermodel/).
package upstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/coalescer/dispatch/dropin/internal/gotest"
	"golang.org/x/mod/modfile"
)

// Version is the release of k8s.io/kubernetes the drop-in is written for.
const Version = "v1.37.2"

// BaselineTag is the build tag that selects upstream's own package in a
// materialised copy instead of the drop-in.
const BaselineTag = "dispatch_upstream"

// LimiterTag, with BaselineTag, selects a model of kubernetes#142123 in a
// materialised copy: upstream's own package with a limiter of the failure
// handler's status patches (see the package in limitermodel/).
const LimiterTag = "dispatch_upstream_limiter"

// GateOnTag is the build tag that turns the SchedulerAsyncAPICalls feature
// gate on by default in a materialised copy, so that every test that does
// not set the gate itself runs with it on.
const GateOnTag = "dispatch_gate_on"

// gateOn is the file GateOnTag selects, in pkg/features: its init runs
// after kube_features.go's (files initialise in name order), which
// registers the gate.
const gateOn = `//go:build ` + GateOnTag + `

// Placed by github.com/coalescer/dispatch/dropin
// (materialise): with -tags ` + GateOnTag + `, SchedulerAsyncAPICalls is on
// unless a test or a flag turns it off.

package features

import utilfeature "k8s.io/apiserver/pkg/util/feature"

func init() {
	if err := utilfeature.DefaultMutableFeatureGate.Set(string(SchedulerAsyncAPICalls) + "=true"); err != nil {
		panic(err)
	}
}
`

// gateOnFile is its name.
const gateOnFile = "zz_dispatch_gate_on.go"

// Package is the import path of the package the drop-in replaces.
const Package = "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"

// The drop-in's source, as compiled and vetted in this module, and the
// test helper that upstream's exported-API test needs from a file the
// drop-in's build leaves out.
var (
	//go:embed apidispatcher/api_dispatcher.go
	dropIn []byte
	//go:embed apidispatcher/expect_test.go
	dropInTest []byte
	//go:embed limitermodel/limiter.go
	limiterModel []byte
)

// The drop-in's file names in the copy.
const (
	dropInFile     = "api_dispatcher_dispatch.go"
	dropInTestFile = "api_dispatcher_dispatch_test.go"
)

// Our modules, which the drop-in needs: a copy requires them at
// ModuleVersion, and points them at a local checkout if Options.Local says
// where one is.
var ourModules = []string{
	"github.com/coalescer/dispatch",
	"github.com/coalescer/dispatch/kube",
	"github.com/coalescer/dispatch/kube/scheduler",
}

// ModuleVersion is the version of our modules a copy requires.
const ModuleVersion = "v0.1.0"

// format changes whenever Materialise changes what it writes, so that a
// copy made by an older version is not reused.
const format = "1"

// Options configures Materialise. The zero value materialises Version into
// the user's cache directory, with our modules taken from the module proxy.
type Options struct {
	// Dir is the directory copies are made in. "" means dispatch-kubernetes
	// under os.UserCacheDir().
	Dir string
	// Local is the root of a checkout of github.com/coalescer/dispatch whose
	// modules the copy uses instead of ModuleVersion (replace directives to
	// its directories). "" means the published modules. LocalCheckout
	// finds the checkout this package was built from, if any.
	Local string
	// Go is the go command to run. "" means "go" from PATH, else the one in
	// runtime.GOROOT().
	Go string
	// Log, if set, receives a line for each step.
	Log io.Writer
}

// Tree is a materialised copy of k8s.io/kubernetes.
type Tree struct {
	// Dir is the copy: a module k8s.io/kubernetes, at a path that depends
	// only on Version, Local and this package's format, so that repeated
	// runs reuse it and the build cache, which keys on directories, stays
	// warm. A build of this package with another drop-in updates the
	// drop-in there in place.
	Dir string
	// Replace is what a consumer's go.mod needs, besides `require
	// k8s.io/kubernetes Version` (and our modules): k8s.io/kubernetes
	// pointed at Dir, each staging repository pinned to its release, and
	// our modules pointed at Local if set.
	Replace []Replacement

	goCmd string // Options.Go
}

// Replacement is one replace directive.
type Replacement struct{ Old, New, NewVersion string }

// String is the directive as a line of a replace block.
func (r Replacement) String() string {
	if r.NewVersion == "" {
		return r.Old + " => " + r.New
	}
	return r.Old + " => " + r.New + " " + r.NewVersion
}

// GoMod returns the lines a consumer's go.mod needs; go mod tidy then adds
// the modules the drop-in's import brings in.
func (t *Tree) GoMod() string {
	var b strings.Builder
	fmt.Fprintf(&b, "require (\n\tk8s.io/kubernetes %s\n\t%s %s // indirect: the drop-in's import\n)\n\n", Version, ourModules[2], ModuleVersion)
	b.WriteString("// k8s.io/kubernetes with dispatch's drop-in in " + Package + "\n// (materialised by github.com/coalescer/dispatch/dropin).\nreplace (\n")
	for _, r := range t.Replace {
		fmt.Fprintf(&b, "\t%s\n", r)
	}
	b.WriteString(")\n")
	return b.String()
}

// GoWork returns the lines a consumer's go.work needs instead: the same
// replacements, which a go.work may carry for every module it uses.
func (t *Tree) GoWork() string {
	var b strings.Builder
	b.WriteString("replace (\n")
	for _, r := range t.Replace {
		fmt.Fprintf(&b, "\t%s\n", r)
	}
	b.WriteString(")\n")
	return b.String()
}

// KubeScheduler is kube-scheduler's main package in a copy, for Build.
const KubeScheduler = "./cmd/kube-scheduler"

// Build compiles the command pkg of the copy (KubeScheduler, say) into the
// file out, with the copy as the main module (outside any workspace) and
// the go build flags given: none for the drop-in, "-tags", BaselineTag for
// upstream's own dispatcher. The first build compiles everything the
// command needs from the copy; later ones only what changed.
func (t *Tree) Build(ctx context.Context, pkg, out string, flags ...string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append(append([]string{"build", "-o", abs}, flags...), pkg)
	cmd := exec.CommandContext(ctx, t.goCmd, args...)
	cmd.Dir, cmd.Env = t.Dir, append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(args, " "), t.Dir, err, out)
	}
	return nil
}

// LocalCheckout returns the root of the checkout of
// github.com/coalescer/dispatch this package was compiled from, or "" if
// it was compiled from elsewhere (the module cache). It looks for the
// repository's go.mod one directory above this file.
func LocalCheckout() string {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	root := filepath.Clean(filepath.Join(filepath.Dir(self), ".."))
	for _, m := range ourModules {
		rel := strings.TrimPrefix(strings.TrimPrefix(m, ourModules[0]), "/")
		if modulePath(filepath.Join(root, rel, "go.mod")) != m {
			return ""
		}
	}
	return root
}

func modulePath(gomod string) string {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return ""
	}
	return modfile.ModulePath(data)
}

// Materialise returns a copy of k8s.io/kubernetes at Version with the
// drop-in in place, making it if it does not exist yet. It is idempotent,
// and safe to run from several processes at once: a copy is made in a
// temporary directory and renamed into place when complete, so one in
// place is always whole (processes that start at once each make one, and
// all but the first rename keep the first's); our files in an existing
// copy are replaced one by one, each by a rename.
func Materialise(ctx context.Context, o Options) (*Tree, error) {
	if o.Go == "" {
		o.Go = gotest.GoCommand()
	}
	if o.Dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("materialise: no cache directory (set Options.Dir): %w", err)
		}
		o.Dir = filepath.Join(cache, "dispatch-kubernetes")
	}
	if o.Local != "" {
		abs, err := filepath.Abs(o.Local)
		if err != nil {
			return nil, err
		}
		o.Local = abs
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	dir := filepath.Join(o.Dir, "kubernetes-"+Version+"-"+key(o.Local))
	t := &Tree{Dir: dir, Replace: replacements(dir, o.Local), goCmd: o.Go}
	want := stamp(o.Local)
	switch have, err := os.ReadFile(filepath.Join(dir, markerFile)); {
	case err == nil && bytes.Equal(have, want):
		return t, nil
	case err == nil:
		// Made by a build of this package with other files of ours, or
		// when the checkout's modules required other versions: put the new
		// files in place, and tidy the copy's go.mod again if the
		// requirements changed. Only what depends on them recompiles.
		logf(o.Log, "updating dispatch's files in %s", dir)
		if err := writeOurs(dir); err != nil {
			return nil, err
		}
		if !bytes.Equal(modsLine(have), modsLine(want)) {
			logf(o.Log, "our modules' go.mod changed: tidying the copy's go.mod again")
			if err := rewriteGoMod(ctx, o, dir); err != nil {
				return nil, err
			}
		}
		return t, writeAtomic(filepath.Join(dir, markerFile), want)
	}
	src, err := moduleDir(ctx, o.Go, "k8s.io/kubernetes@"+Version)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(o.Dir, ".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	logf(o.Log, "copying %s to %s", src, dir)
	if err := copyTree(src, tmp); err != nil {
		return nil, err
	}
	logf(o.Log, "putting the drop-in in %s", Package)
	if err := tagUpstream(filepath.Join(tmp, filepath.FromSlash(packageDir))); err != nil {
		return nil, err
	}
	if err := writeOurs(tmp); err != nil {
		return nil, err
	}
	logf(o.Log, "rewriting go.mod (staging repositories pinned, dispatch required) and go.sum (go mod tidy)")
	if err := rewriteGoMod(ctx, o, tmp); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, markerFile), want, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if current(dir, want) {
			return t, nil // another process made it meanwhile
		}
		return nil, fmt.Errorf("materialise: %w (remove %s if a crashed run left it incomplete)", err, dir)
	}
	logf(o.Log, "done: %s", dir)
	return t, nil
}

// packageDir is Package's directory in the module.
const packageDir = "pkg/scheduler/backend/api_dispatcher"

// markerFile is written last into a complete copy, with the stamp of the
// files of ours it holds.
const markerFile = ".dispatch-materialised"

// current reports whether dir is a finished copy with the files of ours,
// and the requirements, that stamp want says.
func current(dir string, want []byte) bool {
	data, err := os.ReadFile(filepath.Join(dir, markerFile))
	return err == nil && bytes.Equal(data, want)
}

// stamp identifies what a copy holds of ours: the files, and the go.mod
// files of the checkout's modules at local (if any), whose requirements
// the copy's go.mod and go.sum take in.
func stamp(local string) []byte {
	mods := sha256.New()
	if local != "" {
		for _, m := range ourModules {
			rel := strings.TrimPrefix(strings.TrimPrefix(m, ourModules[0]), "/")
			data, _ := os.ReadFile(filepath.Join(local, rel, "go.mod")) // a missing one hashes as empty
			fmt.Fprintf(mods, "%s %x\n", m, sha256.Sum256(data))
		}
	}
	perf := sha256.New()
	perf.Write(perfCallInCopy)
	for _, name := range slices.Sorted(maps.Keys(perfClientFiles)) {
		fmt.Fprintf(perf, "%s %x\n", name, sha256.Sum256([]byte(perfClientFiles[name])))
	}
	model := sha256.New()
	model.Write(limiterModel)
	for _, r := range limiterRun {
		fmt.Fprintf(model, "%q => %q\n", r[0], r[1])
	}
	return fmt.Appendf(nil, "drop-in %x\ndrop-in test %x\ngate %x\nperf client %x\nlimiter model %x\n%s %x\n", sha256.Sum256(dropIn), sha256.Sum256(dropInTest), sha256.Sum256([]byte(gateOn)), perf.Sum(nil), model.Sum(nil), modsPrefix, mods.Sum(nil))
}

// modsPrefix starts the line of a stamp that covers our modules' go.mod
// files.
const modsPrefix = "modules"

// modsLine returns that line of stamp s (nil if it has none).
func modsLine(s []byte) []byte {
	for line := range bytes.Lines(s) {
		if bytes.HasPrefix(line, []byte(modsPrefix+" ")) {
			return line
		}
	}
	return nil
}

// key names a copy by what its path must change with: the release, the
// checkout whose modules it uses, and how this package lays a copy out.
// Not by the content of the drop-in, which is updated in place, so that a
// changed drop-in recompiles only what depends on it: the build cache
// keys on directories.
func key(local string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "k8s.io/kubernetes %s\nlocal %q\nformat %s\n", Version, local, format))
	return hex.EncodeToString(h[:6])
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "materialise: "+format+"\n", args...)
	}
}

// moduleDir downloads module@version into the module cache if needed, and
// returns its directory there.
func moduleDir(ctx context.Context, goCmd, mod string) (string, error) {
	cmd := exec.CommandContext(ctx, goCmd, "mod", "download", "-json", mod)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	cmd.Dir = os.TempDir() // outside any module
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("materialise: go mod download %s: %v: %s", mod, err, stderr.Bytes())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("materialise: go mod download %s: %v", mod, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("materialise: go mod download %s: %s", mod, info.Error)
	}
	return info.Dir, nil
}

// copyTree copies the module tree src into dst, writable (the module cache
// is read-only), leaving out what refers to the staging/ tree the module's
// zip does not have: its go.work, and its vendor/ directory (which holds
// nothing but its OWNERS file, and would put the go command in vendor
// mode).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir() && rel == "vendor":
			return filepath.SkipDir
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case rel == "go.work" || rel == "go.work.sum":
			return nil
		case !d.Type().IsRegular():
			return nil // the module zip has no links; nothing else to copy
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if info.Mode()&0o111 != 0 {
			mode = 0o755
		}
		return copyFile(path, target, mode)
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// upstreamFiles are the package's own files that the drop-in takes the
// place of, with the tests of their private types.
var upstreamFiles = []string{
	"api_dispatcher.go", "call_queue.go", "goroutines_limiter.go",
	"call_queue_test.go", "goroutines_limiter_test.go",
}

// tagUpstream puts upstream's own files of pkg behind BaselineTag, after
// checking that they are the files of the release the drop-in is written
// for. api_dispatcher_test.go, which tests the exported API, is left as it
// is: it runs against either.
func tagUpstream(pkg string) error {
	entries, err := os.ReadDir(pkg)
	if err != nil {
		return err
	}
	var found []string
	for _, e := range entries {
		found = append(found, e.Name())
	}
	want := append(slicesClone(upstreamFiles), "api_dispatcher_test.go")
	sort.Strings(found)
	sort.Strings(want)
	if strings.Join(found, " ") != strings.Join(want, " ") {
		return fmt.Errorf("materialise: %s has %v, not the files of %s's package (%v): the drop-in is written for that release", pkg, found, Version, want)
	}
	for _, name := range upstreamFiles {
		path := filepath.Join(pkg, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		tagged := append([]byte("//go:build "+BaselineTag+"\n\n"), data...)
		if err := os.WriteFile(path, tagged, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeOurs writes the files of ours into the copy at root: the drop-in
// and its test helper, behind !BaselineTag, the gate file, and
// scheduler_perf's client files (see PerfClientTag).
func writeOurs(root string) error {
	if err := patchPerfHarness(root); err != nil {
		return err
	}
	pkg := filepath.Join(root, filepath.FromSlash(packageDir))
	header := "//go:build !" + BaselineTag + "\n\n// Code placed here by github.com/coalescer/dispatch/dropin\n// (materialise); build with -tags " + BaselineTag + " for upstream's package.\n\n"
	if err := writeAtomic(filepath.Join(pkg, dropInFile), append([]byte(header), dropIn...)); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(pkg, dropInTestFile), append([]byte(header), dropInTest...)); err != nil {
		return err
	}
	if err := writeLimiterModel(pkg); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(root, "pkg", "features", gateOnFile), []byte(gateOn))
}

// The model of kubernetes#142123's files in the copy: upstream's
// api_dispatcher.go with limiterRun's changes, and the limiter.
const (
	limiterRunFile   = "api_dispatcher_limiter_run.go"
	limiterModelFile = "api_dispatcher_limiter_model.go"
)

// limiterRun are the changes that make upstream's api_dispatcher.go the
// model's, each an exact piece of its Run and what replaces it: the
// context Run makes for the executions carries the limiter, and each
// call's goroutine takes a slot before it executes the call (see
// limitermodel/).
var limiterRun = [][2]string{
	{"ctx, cancel := context.WithCancel(context.Background())",
		"ctx, cancel := context.WithCancel(withFailureHandlerLimiter(context.Background()))"},
	{"\t\t\tgo func() {\n\t\t\t\tstartTime := time.Now()\n",
		"\t\t\tgo func() {\n\t\t\t\tdefer acquireFailureHandlerSlot(ctx, apiCall.APICall)()\n\t\t\t\tstartTime := time.Now()\n"},
}

// writeLimiterModel writes the model of kubernetes#142123 into the
// package directory pkg of a copy: upstream's api_dispatcher.go goes
// behind BaselineTag and not LimiterTag, and a copy of it with
// limiterRun's changes, and the limiter, behind both. It checks that each
// change applies exactly once: the model is written for Version.
func writeLimiterModel(pkg string) error {
	path := filepath.Join(pkg, "api_dispatcher.go")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// Upstream's text, without the build line tagUpstream (or an earlier
	// writeLimiterModel) put first.
	orig := data
	if first, rest, ok := bytes.Cut(data, []byte("\n\n")); ok && bytes.HasPrefix(first, []byte("//go:build "+BaselineTag)) {
		orig = rest
	}
	upstreamOnly := append([]byte("//go:build "+BaselineTag+" && !"+LimiterTag+"\n\n"), orig...)
	if !bytes.Equal(upstreamOnly, data) {
		if err := writeAtomic(path, upstreamOnly); err != nil {
			return err
		}
	}
	run := string(orig)
	for _, r := range limiterRun {
		if n := strings.Count(run, r[0]); n != 1 {
			return fmt.Errorf("materialise: %s has %q %d times, not once: the model of kubernetes#142123 is written for %s's api_dispatcher.go", path, r[0], n, Version)
		}
		run = strings.Replace(run, r[0], r[1], 1)
	}
	header := "//go:build " + BaselineTag + " && " + LimiterTag + "\n\n" +
		"// Code placed here by github.com/coalescer/dispatch/dropin (materialise):\n" +
		"// a model of kubernetes#142123; build with -tags " + BaselineTag + "," + LimiterTag + ".\n\n"
	if err := writeAtomic(filepath.Join(pkg, limiterRunFile), []byte(header+run)); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(pkg, limiterModelFile), append([]byte(header), limiterModel...))
}

// writeAtomic writes data to path through a temporary file renamed into
// place, so that a reader sees the old content or the new, whole.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// stagingVersion is the release of the staging repositories that goes
// with Version: v1.37.2 → v0.37.2.
func stagingVersion() string { return "v0" + strings.TrimPrefix(Version, "v1") }

// replacements are what a consumer needs: the copy, the staging pins, and
// our local modules.
func replacements(dir, local string) []Replacement {
	rs := []Replacement{{Old: "k8s.io/kubernetes", New: dir}}
	for _, m := range stagingModules {
		rs = append(rs, Replacement{Old: m, New: m, NewVersion: stagingVersion()})
	}
	if local != "" {
		for _, m := range ourModules {
			rel := strings.TrimPrefix(strings.TrimPrefix(m, ourModules[0]), "/")
			rs = append(rs, Replacement{Old: m, New: filepath.Join(local, rel)})
		}
	}
	return rs
}

// rewriteGoMod makes the copy's go.mod work where the staging/ tree is
// missing: each staging repository, which the original points at
// ./staging/src/..., is pinned to its release; our modules are required
// (and pointed at Local, if set); then go mod tidy completes go.sum.
func rewriteGoMod(ctx context.Context, o Options, dir string) error {
	path := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		return err
	}
	staging := map[string]bool{}
	for _, m := range stagingModules {
		staging[m] = true
	}
	for _, r := range f.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") && !staging[r.Old.Path] {
			return fmt.Errorf("materialise: %s replaces %s with its staging tree, and this tool does not know it: update stagingModules", path, r.Old.Path)
		}
	}
	for _, r := range replacements(dir, o.Local)[1:] {
		if err := f.AddReplace(r.Old, "", r.New, r.NewVersion); err != nil {
			return err
		}
	}
	if err := f.AddRequire(ourModules[2], ModuleVersion); err != nil {
		return err
	}
	f.Cleanup()
	out, err := f.Format()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, o.Go, "mod", "tidy")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if o.Log != nil {
		cmd.Stdout, cmd.Stderr = o.Log, o.Log
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("materialise: go mod tidy in the copy: %w", err)
	}
	return nil
}

// stagingModules are the staging repositories k8s.io/kubernetes at Version
// replaces with its staging/ tree.
var stagingModules = []string{
	"k8s.io/api",
	"k8s.io/apiextensions-apiserver",
	"k8s.io/apimachinery",
	"k8s.io/apiserver",
	"k8s.io/cli-runtime",
	"k8s.io/client-go",
	"k8s.io/cloud-provider",
	"k8s.io/cluster-bootstrap",
	"k8s.io/code-generator",
	"k8s.io/component-base",
	"k8s.io/component-helpers",
	"k8s.io/controller-manager",
	"k8s.io/cri-api",
	"k8s.io/cri-client",
	"k8s.io/cri-streaming",
	"k8s.io/csi-translation-lib",
	"k8s.io/dynamic-resource-allocation",
	"k8s.io/endpointslice",
	"k8s.io/externaljwt",
	"k8s.io/kms",
	"k8s.io/kube-aggregator",
	"k8s.io/kube-controller-manager",
	"k8s.io/kube-proxy",
	"k8s.io/kube-scheduler",
	"k8s.io/kubectl",
	"k8s.io/kubelet",
	"k8s.io/metrics",
	"k8s.io/mount-utils",
	"k8s.io/pod-security-admission",
	"k8s.io/sample-apiserver",
	"k8s.io/sample-cli-plugin",
	"k8s.io/sample-controller",
	"k8s.io/streaming",
}
