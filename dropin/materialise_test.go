package upstream

import (
	"bytes"
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coalescer/dispatch/dropin/internal/gotest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/mod/modfile"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// upstreamPerf returns the directory of upstream's scheduler_perf in the
// module cache.
func upstreamPerf(t *testing.T) string {
	src, err := moduleDir(t.Context(), gotest.GoCommand(), "k8s.io/kubernetes@"+Version)
	require.NoError(t, err)
	return filepath.Join(src, filepath.FromSlash(perfDir))
}

// copyPerfUtil copies scheduler_perf's util.go as released into the tree
// at root, as writeOurs needs it.
func copyPerfUtil(t *testing.T, root string) {
	dir := filepath.Join(root, filepath.FromSlash(perfDir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, copyFile(filepath.Join(upstreamPerf(t), "util.go"), filepath.Join(dir, "util.go"), 0o644))
}

// upstreamPackage returns the directory of upstream's package in the
// module cache.
func upstreamPackage(t *testing.T) string {
	src, err := moduleDir(t.Context(), gotest.GoCommand(), "k8s.io/kubernetes@"+Version)
	require.NoError(t, err)
	return filepath.Join(src, "pkg", "scheduler", "backend", "api_dispatcher")
}

// TestPlaceDropIn: in a copy of upstream's package, the default build has
// the drop-in's two files and upstream's exported-API test, and a build
// with BaselineTag upstream's files exactly.
func TestPlaceDropIn(t *testing.T) {
	root := t.TempDir()
	pkg := filepath.Join(root, filepath.FromSlash(packageDir))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "pkg", "features"), 0o755))
	require.NoError(t, copyTree(upstreamPackage(t), pkg))
	copyPerfUtil(t, root)
	require.NoError(t, tagUpstream(pkg))
	require.NoError(t, writeOurs(root))

	files := func(tags ...string) ([]string, []string) {
		ctxt := build.Default
		ctxt.BuildTags = tags
		p, err := ctxt.ImportDir(pkg, 0)
		require.NoError(t, err)
		return p.GoFiles, p.TestGoFiles
	}
	gofiles, tests := files()
	assert.Equal(t, []string{dropInFile}, gofiles)
	assert.Equal(t, []string{dropInTestFile, "api_dispatcher_test.go"}, tests)
	gofiles, tests = files(BaselineTag)
	assert.Equal(t, []string{"api_dispatcher.go", "call_queue.go", "goroutines_limiter.go"}, gofiles)
	assert.Equal(t, []string{"api_dispatcher_test.go", "call_queue_test.go", "goroutines_limiter_test.go"}, tests)
	gofiles, tests = files(BaselineTag, LimiterTag)
	assert.Equal(t, []string{limiterModelFile, limiterRunFile, "call_queue.go", "goroutines_limiter.go"}, gofiles, "the model: upstream's Run changed, and the limiter")
	assert.Equal(t, []string{"api_dispatcher_test.go", "call_queue_test.go", "goroutines_limiter_test.go"}, tests)

	// The model's Run is upstream's with limiterRun's changes, and nothing
	// else; writing our files again changes nothing.
	orig, err := os.ReadFile(filepath.Join(upstreamPackage(t), "api_dispatcher.go"))
	require.NoError(t, err)
	run, err := os.ReadFile(filepath.Join(pkg, limiterRunFile))
	require.NoError(t, err)
	want := string(orig)
	for _, r := range limiterRun {
		want = strings.Replace(want, r[0], r[1], 1)
	}
	_, body, _ := strings.Cut(string(run), "\n\n// Code placed here")
	_, body, _ = strings.Cut(body, ".\n\n")
	assert.Equal(t, want, body)
	upstreamRun, err := os.ReadFile(filepath.Join(pkg, "api_dispatcher.go"))
	require.NoError(t, err)
	require.NoError(t, writeOurs(root))
	again, err := os.ReadFile(filepath.Join(pkg, "api_dispatcher.go"))
	require.NoError(t, err)
	assert.Equal(t, upstreamRun, again)
	assert.Equal(t, "//go:build "+BaselineTag+" && !"+LimiterTag+"\n\n"+string(orig), string(again), "upstream's Run, behind the tags")

	orig, err = os.ReadFile(filepath.Join(upstreamPackage(t), "call_queue.go"))
	require.NoError(t, err)
	tagged, err := os.ReadFile(filepath.Join(pkg, "call_queue.go"))
	require.NoError(t, err)
	assert.Equal(t, "//go:build "+BaselineTag+"\n\n"+string(orig), string(tagged), "upstream's file, behind the tag, otherwise untouched")
	test, err := os.ReadFile(filepath.Join(pkg, "api_dispatcher_test.go"))
	require.NoError(t, err)
	orig, err = os.ReadFile(filepath.Join(upstreamPackage(t), "api_dispatcher_test.go"))
	require.NoError(t, err)
	assert.Equal(t, orig, test, "the exported-API test is left as it is")
}

// TestPlaceDropInOtherRelease: a package whose files are not the ones the
// drop-in was written for is refused, not patched blindly.
func TestPlaceDropInOtherRelease(t *testing.T) {
	pkg := t.TempDir()
	require.NoError(t, copyTree(upstreamPackage(t), pkg))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "new_in_a_later_release.go"), []byte("package apidispatcher\n"), 0o644))
	err := tagUpstream(pkg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "written for that release")
}

// TestStagingModules: the staging repositories pinned are exactly those
// upstream's go.mod points at its staging/ tree.
func TestStagingModules(t *testing.T) {
	src, err := moduleDir(t.Context(), gotest.GoCommand(), "k8s.io/kubernetes@"+Version)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(src, "go.mod"))
	require.NoError(t, err)
	f, err := modfile.Parse("go.mod", data, nil)
	require.NoError(t, err)
	var staged []string
	for _, r := range f.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") {
			staged = append(staged, r.Old.Path)
		}
	}
	slices.Sort(staged)
	assert.Equal(t, staged, slices.Sorted(slices.Values(stagingModules)))
	assert.Equal(t, "v0.37.2", stagingVersion())
}

// TestGoModLines: what a consumer is told to add parses as go.mod (and
// go.work) syntax and says what it must.
func TestGoModLines(t *testing.T) {
	tr := &Tree{Dir: "/cache/k", Replace: replacements("/cache/k", "/src/dispatch")}
	f, err := modfile.Parse("go.mod", []byte("module example.com/consumer\n\ngo 1.26.0\n\n"+tr.GoMod()), nil)
	require.NoError(t, err)
	require.Len(t, f.Require, 2)
	assert.Equal(t, "k8s.io/kubernetes", f.Require[0].Mod.Path)
	assert.Equal(t, Version, f.Require[0].Mod.Version)
	assert.Equal(t, "github.com/coalescer/dispatch/kube/scheduler", f.Require[1].Mod.Path, "the drop-in's import, which go mod tidy completes")
	got := map[string]string{}
	for _, r := range f.Replace {
		got[r.Old.Path] = strings.TrimSpace(r.New.Path + " " + r.New.Version)
	}
	assert.Equal(t, "/cache/k", got["k8s.io/kubernetes"])
	assert.Equal(t, "k8s.io/client-go v0.37.2", got["k8s.io/client-go"])
	assert.Equal(t, "/src/dispatch/kube/scheduler", got["github.com/coalescer/dispatch/kube/scheduler"])
	assert.Equal(t, "/src/dispatch", got["github.com/coalescer/dispatch"])
	assert.Len(t, got, 1+len(stagingModules)+len(ourModules))

	w, err := modfile.ParseWork("go.work", []byte("go 1.26.0\n\nuse .\n\n"+tr.GoWork()), nil)
	require.NoError(t, err)
	assert.Len(t, w.Replace, len(got))

	published := &Tree{Replace: replacements("/cache/k", "")}
	f, err = modfile.Parse("go.mod", []byte("module example.com/consumer\n\n"+published.GoMod()), nil)
	require.NoError(t, err)
	assert.Len(t, f.Replace, 1+len(stagingModules), "without a checkout, our modules come from the proxy")
}

// TestLocalCheckout: built from this repository, the package finds it.
func TestLocalCheckout(t *testing.T) {
	want, err := filepath.Abs("..")
	require.NoError(t, err)
	assert.Equal(t, want, LocalCheckout())
}

// TestCopyPath: the copy's path depends on the checkout it uses, and not
// on our files in it, which are updated in place.
func TestCopyPath(t *testing.T) {
	assert.Equal(t, key("/a"), key("/a"))
	assert.NotEqual(t, key("/a"), key("/b"))
	assert.NotEqual(t, key(""), key("/a"))
}

// TestRefresh: a copy made with other files of ours is brought up to date
// in place, without copying the tree again.
func TestRefresh(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "kubernetes-"+Version+"-"+key(""))
	pkg := filepath.Join(dir, filepath.FromSlash(packageDir))
	require.NoError(t, os.MkdirAll(pkg, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "pkg", "features"), 0o755))
	copyPerfUtil(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(pkg, dropInFile), []byte("an older drop-in"), 0o644))
	// Upstream's Run as a copy made before the model of kubernetes#142123
	// has it, behind BaselineTag alone.
	orig, err := os.ReadFile(filepath.Join(upstreamPackage(t), "api_dispatcher.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "api_dispatcher.go"), append([]byte("//go:build "+BaselineTag+"\n\n"), orig...), 0o644))
	// An older drop-in, with the same modules: only our files change.
	older := append([]byte("drop-in 0\n"), modsLine(stamp(""))...)
	require.NoError(t, os.WriteFile(filepath.Join(dir, markerFile), older, 0o644))
	require.False(t, current(dir, stamp("")))

	tr, err := Materialise(t.Context(), Options{Dir: base})
	require.NoError(t, err)
	assert.Equal(t, dir, tr.Dir)
	assert.True(t, current(dir, stamp("")))
	got, err := os.ReadFile(filepath.Join(pkg, dropInFile))
	require.NoError(t, err)
	assert.Contains(t, string(got), string(dropIn))
	got, err = os.ReadFile(filepath.Join(pkg, "api_dispatcher.go"))
	require.NoError(t, err)
	assert.Equal(t, "//go:build "+BaselineTag+" && !"+LimiterTag+"\n\n"+string(orig), string(got), "upstream's Run, out of the model's build")
	_, err = os.Stat(filepath.Join(pkg, limiterModelFile))
	require.NoError(t, err, "the model's limiter")
	_, err = os.Stat(filepath.Join(dir, "go.mod"))
	assert.True(t, os.IsNotExist(err), "nothing else was written")
}

// TestStampModules: a copy's stamp changes with the go.mod of any of the
// checkout's modules (whose requirements the copy takes in, so that it is
// tidied again), and not with anything else in them.
func TestStampModules(t *testing.T) {
	local := t.TempDir()
	for _, rel := range []string{"", "kube", "kube/scheduler"} {
		require.NoError(t, os.MkdirAll(filepath.Join(local, rel), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(local, rel, "go.mod"), []byte("module x\n"), 0o644))
	}
	before := stamp(local)
	require.NoError(t, os.WriteFile(filepath.Join(local, "kube", "other.go"), []byte("package kube\n"), 0o644))
	assert.Equal(t, before, stamp(local))
	require.NoError(t, os.WriteFile(filepath.Join(local, "kube", "go.mod"), []byte("module x\n\nrequire y v1.0.0\n"), 0o644))
	after := stamp(local)
	assert.NotEqual(t, modsLine(before), modsLine(after))
	assert.NotEmpty(t, modsLine(after))
	assert.Equal(t, bytes.TrimSuffix(before, modsLine(before)), bytes.TrimSuffix(after, modsLine(after)), "the files' lines stay")
}
