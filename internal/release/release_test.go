package main

import (
	"archive/zip"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	modzip "golang.org/x/mod/zip"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeRepo writes a repository of four modules plus test data, laid out
// as this one is: example.com/m at the root, example.com/m/sub published
// beside it, bench and harness unpublished (harness requires bench),
// testdata/x ignored.
func fakeRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"go.mod":  "module example.com/m\n\ngo 1.26.0\n",
		"LICENSE": "license\n",
		"m.go":    "package m\n\n// Name is the module's name.\nconst Name = \"m\"\n",
		"README.md": "# m\n\n## Install\n\n```sh\ngo get example.com/m@v0.1.0       # the core\n" +
			"go get example.com/m/sub@v0.1.0\n```\n",
		"go.work": "go 1.26.0\n\nuse (\n\t.\n\t./bench\n\t./harness\n\t./sub\n)\n\nreplace (\n" +
			"\texample.com/m v0.1.0 => ./\n\texample.com/m/bench v0.1.0 => ./bench\n\texample.com/m/sub v0.1.0 => ./sub\n)\n",
		"sub/go.mod":  "module example.com/m/sub\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n",
		"sub/LICENSE": "license\n",
		"sub/sub.go":  "package sub\n\nimport \"example.com/m\"\n\n// Name is the module's name.\nconst Name = m.Name + \"/sub\"\n",
		"bench/go.mod": "// Unpublished: benchmarks.\nmodule example.com/m/bench\n\ngo 1.26.0\n\n" +
			"require example.com/m v0.1.0\n",
		"bench/b.go": "package bench\n",
		"harness/go.mod": "// Unpublished: a harness.\nmodule example.com/m/harness\n\ngo 1.26.0\n\n" +
			"require example.com/m/bench v0.1.0\n",
		"testdata/x/go.mod":   "module example.com/x\n\ngo 1.26.0\n",
		"internal/i/i.go":     "package i\n",
		"internal/i/i_test.x": "kept in the zip\n",
	}
	for name, data := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
	}
	return root
}

func edit(t *testing.T, root, name string, f func(string) string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(name))
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte(f(string(data))), 0o644))
}

func TestLoadRepo(t *testing.T) {
	r, err := loadRepo(fakeRepo(t), "v0.1.0")
	require.NoError(t, err)
	var got []string
	for _, m := range r.modules {
		got = append(got, m.rel+" "+m.path+map[bool]string{true: " published", false: ""}[m.published])
	}
	assert.Equal(t, []string{
		". example.com/m published",
		"bench example.com/m/bench",
		"harness example.com/m/harness",
		"sub example.com/m/sub published",
	}, got, "testdata/x is test data, bench and harness say they are unpublished")
	assert.Equal(t, "sub/v0.1.0", r.tag(r.modules[3]))
	assert.Equal(t, "v0.1.0", r.tag(r.modules[0]))
	assert.Empty(t, r.lint())

	_, err = loadRepo(fakeRepo(t), "0.1")
	assert.ErrorContains(t, err, "canonical")
}

func TestLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		edit func(string) string
		want string
	}{
		{"replace in a published module", "sub/go.mod",
			func(s string) string { return s + "replace example.com/other => ../other\n" },
			"sub/go.mod: published, yet replaces example.com/other"},
		{"our module replaced", "bench/go.mod",
			func(s string) string { return s + "replace example.com/m => ../\n" },
			"bench/go.mod replaces example.com/m"},
		{"our module at another version", "bench/go.mod",
			func(s string) string { return strings.Replace(s, "v0.1.0", "v0.0.0-00010101000000-000000000000", 1) },
			"bench/go.mod requires example.com/m at v0.0.0-00010101000000-000000000000"},
		{"a published module where its path is not", "sub/go.mod",
			func(s string) string { return strings.Replace(s, "example.com/m/sub", "example.com/m/other", 1) },
			"sub/go.mod: published as example.com/m/other, but its tag sub/v0.1.0 would publish example.com/m/sub"},
		{"no LICENSE", "sub/LICENSE", nil,
			"sub/go.mod: published without a LICENSE"},
		{"go.work without the replace", "go.work",
			func(s string) string { return strings.Replace(s, "\texample.com/m/sub v0.1.0 => ./sub\n", "", 1) },
			"go.work: missing replace example.com/m/sub v0.1.0 => ./sub"},
		{"go.work without a required unpublished module's replace", "go.work",
			func(s string) string { return strings.Replace(s, "\texample.com/m/bench v0.1.0 => ./bench\n", "", 1) },
			"go.work: missing replace example.com/m/bench v0.1.0 => ./bench"},
		{"a published module requiring an unpublished one", "sub/go.mod",
			func(s string) string { return s + "require example.com/m/bench v0.1.0\n" },
			"sub/go.mod: published, yet requires example.com/m/bench, which is not"},
		{"go.work without the module", "go.work",
			func(s string) string { return strings.Replace(s, "\t./bench\n", "", 1) },
			"go.work does not use bench"},
		{"README without a module", "README.md",
			func(s string) string { return strings.Replace(s, "go get example.com/m/sub@v0.1.0\n", "", 1) },
			`Install gets ["example.com/m@v0.1.0"]`},
		{"README with another version", "README.md",
			func(s string) string { return strings.Replace(s, "sub@v0.1.0", "sub@latest", 1) },
			`Install gets ["example.com/m/sub@latest" "example.com/m@v0.1.0"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRepo(t)
			if tc.edit == nil {
				require.NoError(t, os.Remove(filepath.Join(root, tc.file)))
			} else {
				edit(t, root, tc.file, tc.edit)
			}
			r, err := loadRepo(root, "v0.1.0")
			require.NoError(t, err)
			err = errors.Join(r.lint()...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestInstallLines(t *testing.T) {
	lines, err := installLines([]byte("# x\n\n```sh\ngo run .\n```\n\n## Install\n\nGo 1.26.\n\n```sh\n" +
		"go get a@v1  # comment\n\ngo get b@v1 c@v1\n```\n\n```sh\ngo get d@v1\n```\n"))
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"go", "get", "a@v1"}, {"go", "get", "b@v1", "c@v1"}}, lines)

	for readme, want := range map[string]string{
		"# x\n":                      "no sh block under an Install heading",
		"## Install\n\n```sh\n```\n": "no go get line",
		"## Install\n\n```sh\ngo get -u a@v1\n```\n":      "only plain go get lines",
		"## Install\n\n```sh\ngo install a@v1\n```\n":     "only plain go get lines",
		"## Install\n\n## Next\n\n```sh\ngo get a\n```\n": "no sh block under an Install heading",
	} {
		_, err := installLines([]byte(readme))
		assert.ErrorContains(t, err, want, readme)
	}
}

func TestUntidy(t *testing.T) {
	r, err := loadRepo(fakeRepo(t), "v0.1.0")
	require.NoError(t, err)
	ours := "--- current/go.sum\n+++ tidy/go.sum\n@@ -1,2 +1,4 @@\n" +
		"+example.com/m v0.1.0 h1:abc=\n+example.com/m v0.1.0/go.mod h1:def=\n golang.org/x/mod v0.37.0 h1:x=\n"
	assert.Empty(t, r.untidy(ours), "our modules' checksums are left out on purpose")

	theirs := "--- current/go.mod\n+++ tidy/go.mod\n@@ -3 +3 @@\n-require example.com/m v0.1.0\n" +
		"--- current/go.sum\n+++ tidy/go.sum\n@@ -1 +1,3 @@\n+golang.org/x/mod v0.37.0 h1:x=\n+example.com/m/bench v0.1.0 h1:y=\n" +
		"+example.com/mod v0.1.0 h1:z=\n"
	assert.Equal(t, "-require example.com/m v0.1.0\n+golang.org/x/mod v0.37.0 h1:x=\n+example.com/mod v0.1.0 h1:z=\n",
		r.untidy(theirs), "go.mod lines always count, and so do go.sum lines of modules not ours")
}

func zipNames(t *testing.T, name string) []string {
	t.Helper()
	zr, err := zip.OpenReader(name)
	require.NoError(t, err)
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

// TestProxy builds the proxy of a fake repository and gets its modules from
// it, as the consumer check does.
func TestProxy(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	r, err := loadRepo(fakeRepo(t), "v0.1.0")
	require.NoError(t, err)
	w, err := newWork()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, w.remove()) })
	w.goproxy = fileURL(w.proxy) + ",off" // example.com/m is all there is
	require.NoError(t, r.buildProxy(w.proxy))

	v := filepath.Join(w.proxy, "example.com", "m", "@v")
	for _, f := range []string{"list", "v0.1.0.info", "v0.1.0.mod", "v0.1.0.zip"} {
		assert.FileExists(t, filepath.Join(v, f))
	}
	assert.Equal(t, []string{
		"example.com/m@v0.1.0/LICENSE", "example.com/m@v0.1.0/README.md", "example.com/m@v0.1.0/go.mod",
		"example.com/m@v0.1.0/go.work", "example.com/m@v0.1.0/internal/i/i.go", "example.com/m@v0.1.0/internal/i/i_test.x",
		"example.com/m@v0.1.0/m.go",
	}, zipNames(t, filepath.Join(v, "v0.1.0.zip")), "nested modules are left out, testdata/x with them")
	assert.Equal(t, []string{
		"example.com/m/sub@v0.1.0/LICENSE", "example.com/m/sub@v0.1.0/go.mod", "example.com/m/sub@v0.1.0/sub.go",
	}, zipNames(t, filepath.Join(w.proxy, "example.com", "m", "sub", "@v", "v0.1.0.zip")))
	assert.FileExists(t, filepath.Join(w.proxy, "example.com", "m", "bench", "@v", "v0.1.0.zip"),
		"bench is unpublished, but harness requires it: go mod tidy in harness needs it")
	assert.NoDirExists(t, filepath.Join(w.proxy, "example.com", "m", "harness"), "harness is unpublished")

	ctx := context.Background()
	dir := filepath.Join(w.dir, "consumer")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(
		"package main\n\nimport \"example.com/m/sub\"\n\nfunc main() { println(sub.Name) }\n"), 0o644))
	_, err = r.goIn(ctx, w, dir, "mod", "init", "example.com/consumer")
	require.NoError(t, err)
	_, err = r.goIn(ctx, w, dir, "get", "example.com/m/sub@v0.1.0")
	require.NoError(t, err)
	out, err := r.goIn(ctx, w, dir, "list", "-m", "all")
	require.NoError(t, err)
	assert.Equal(t, "example.com/consumer\nexample.com/m v0.1.0\nexample.com/m/sub v0.1.0\n", out)
	_, err = r.goIn(ctx, w, dir, "build", "-o", filepath.Join(dir, "consumer"), ".")
	require.NoError(t, err)
}

// TestProxyLimits: a module the proxy would refuse is refused here first.
func TestProxyLimits(t *testing.T) {
	root := fakeRepo(t)
	big := filepath.Join(root, "internal", "big.bin")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(modzip.MaxZipFile+1)) // sparse: nothing is written
	require.NoError(t, f.Close())
	r, err := loadRepo(root, "v0.1.0")
	require.NoError(t, err)
	err = r.buildProxy(t.TempDir())
	assert.ErrorContains(t, err, "example.com/m: module zip: module source tree too large")

	root = fakeRepo(t)
	require.NoError(t, os.WriteFile(filepath.Join(root, "internal", "i", "I.GO"), nil, 0o644))
	r, err = loadRepo(root, "v0.1.0")
	require.NoError(t, err)
	err = r.buildProxy(t.TempDir())
	assert.ErrorContains(t, err, "module zip:", "a case-insensitive collision is refused")
}

func TestWithin(t *testing.T) {
	assert.True(t, within("/a/b", "/a/b"))
	assert.True(t, within("/a/b", "/a/b/c"))
	assert.False(t, within("/a/b", "/a/bc"))
	assert.False(t, within("/a/b", "/a"))
	assert.Equal(t, "file:///tmp/x", fileURL("/tmp/x"))
}
