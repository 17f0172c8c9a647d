package upstream

import (
	"bytes"
	"go/build"
	gofmt "go/format"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPerfHarness: in a copy of scheduler_perf, util.go differs from the
// released file in the one call that starts the scheduler, whose client
// the tag decides; a default build has the file that leaves it as
// released, a build with PerfClientTag the one that sets the rate; the
// files are gofmt'd Go; patching again changes nothing.
func TestPerfHarness(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, filepath.FromSlash(perfDir))
	require.NoError(t, copyTree(upstreamPerf(t), dir))
	orig, err := os.ReadFile(filepath.Join(dir, "util.go"))
	require.NoError(t, err)

	require.NoError(t, patchPerfHarness(root))
	patched, err := os.ReadFile(filepath.Join(dir, "util.go"))
	require.NoError(t, err)
	assert.Equal(t, string(bytes.Replace(orig, perfCall, perfCallInCopy, 1)), string(patched))
	assert.NotEqual(t, orig, patched)

	files := func(tags ...string) []string {
		ctxt := build.Default
		ctxt.BuildTags = tags
		p, err := ctxt.ImportDir(dir, 0)
		require.NoError(t, err)
		return p.GoFiles
	}
	assert.Contains(t, files(), "zz_dispatch_perf_client_off.go")
	assert.NotContains(t, files(), "zz_dispatch_perf_client.go")
	assert.Contains(t, files(PerfClientTag), "zz_dispatch_perf_client.go")
	assert.NotContains(t, files(PerfClientTag), "zz_dispatch_perf_client_off.go")
	assert.Equal(t, slices.DeleteFunc(files(), isPerfClientFile), slices.DeleteFunc(files(PerfClientTag), isPerfClientFile), "the tag chooses between our two files and nothing else")

	for name, src := range perfClientFiles {
		formatted, err := gofmt.Source([]byte(src))
		require.NoError(t, err, name)
		assert.Equal(t, src, string(formatted), "%s is gofmt'd", name)
	}

	require.NoError(t, patchPerfHarness(root), "a patched copy is patched again without error")
	again, err := os.ReadFile(filepath.Join(dir, "util.go"))
	require.NoError(t, err)
	assert.Equal(t, patched, again)
}

func isPerfClientFile(name string) bool { _, ok := perfClientFiles[name]; return ok }

// TestPerfHarnessOtherRelease: a util.go that does not start the scheduler
// as the release's does is refused, not patched blindly, and left as it is.
func TestPerfHarnessOtherRelease(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, filepath.FromSlash(perfDir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	other := []byte("package benchmark\n\nfunc start() { util.StartSchedulerWithDone(tCtx, cfg, nil) }\n")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "util.go"), other, 0o644))
	err := patchPerfHarness(root)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "written for that release")
	got, err := os.ReadFile(filepath.Join(dir, "util.go"))
	require.NoError(t, err)
	assert.Equal(t, other, got)
	_, err = os.Stat(filepath.Join(dir, "zz_dispatch_perf_client.go"))
	assert.True(t, os.IsNotExist(err), "nothing written")
}
