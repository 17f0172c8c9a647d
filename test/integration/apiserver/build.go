package apiserver

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// pinnedBuild is a server binary the tests build with the go command from
// a module of this package's test data, testdata/NAME, whose go.mod pins
// the release: etcd ([etcdBuild]) and kube-apiserver ([kubeAPIServerBuild]).
// Each is built once per machine (see [pinnedBuild.build]) and once per test
// binary at most ([pinnedBuild.binary]).
type pinnedBuild struct {
	// name is the binary's, its test data module's directory's and, with
	// a dispatch- prefix, its cache directory's.
	name string
	// module is the module, required by the test data module's go.mod,
	// whose version names the build.
	module string
	// pkg is the main package to build, in the test data module: "." for
	// a main.go of its own, or the package of a tool directive.
	pkg string
	// files are the test data module's files the build depends on,
	// hashed into the cache directory's name.
	files []string
	// coldBuild says how long a build takes on a cold Go build cache.
	coldBuild string

	mu   sync.Mutex
	done bool
	path string
	err  error
}

// etcdBuild is etcd's own main package (testdata/etcd/main.go) at the
// server release of the 3.7 line that Kubernetes 1.37 is tested with.
var etcdBuild = &pinnedBuild{
	name:      "etcd",
	module:    "go.etcd.io/etcd/server/v3",
	pkg:       ".",
	files:     []string{"go.mod", "go.sum", "main.go"},
	coldBuild: "about a minute on two cores",
}

// kubeAPIServerBuild is upstream's cmd/kube-apiserver at the release the
// test data module's go.mod pins (a tool directive), without the race
// detector: the race detector is for this repository's code, which runs in
// the test binaries, not in kube-apiserver.
var kubeAPIServerBuild = &pinnedBuild{
	name:      "kube-apiserver",
	module:    "k8s.io/kubernetes",
	pkg:       "k8s.io/kubernetes/cmd/kube-apiserver",
	files:     []string{"go.mod", "go.sum"},
	coldBuild: "several minutes on two cores",
}

// binary returns the path of the binary [pinnedBuild.build] builds,
// building it at most once per test binary: its first caller builds (or
// finds) it, the others get the same path or error.
func (b *pinnedBuild) binary(t testing.TB) (string, error) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.path, b.err = b.build(t)
		b.done = true
	}
	return b.path, b.err
}

// build builds the main package of the module in testdata/NAME with the
// go command, outside the workspace (GOWORK=off), into the user's cache
// directory: dispatch-NAME/VERSION-HASH/NAME under [os.UserCacheDir], where
// HASH covers the module's files. A binary already there is reused, so a
// machine builds each pinned release once.
//
// Test binaries run in parallel (go test runs packages at once), so the
// build holds a file lock in that directory where the system has flock(2),
// and writes to a temporary name renamed into place: a binary at the final
// path is always complete.
//
// The module's source is found next to this file's, through
// runtime.Caller: the tests run from a source checkout.
func (b *pinnedBuild) build(t testing.TB) (string, error) {
	t.Helper()
	src, err := b.sourceDir()
	if err != nil {
		return "", err
	}
	version, hash, err := b.sourceKey(src)
	if err != nil {
		return "", err
	}
	bin := b.cachePath(version, hash)
	if isFile(bin) {
		t.Logf("%s: using %s, built earlier from %s", b.name, bin, src)
		return bin, nil
	}

	dir := filepath.Dir(bin)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if isFile(bin) { // another test binary built it while this one waited
		t.Logf("%s: using %s, built by another test binary", b.name, bin)
		return bin, nil
	}
	if err := b.compile(t, src, version, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// sourceDir returns the directory of the module in testdata/NAME, found
// next to this file's.
func (b *pinnedBuild) sourceDir() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the %s build module: runtime.Caller failed", b.name)
	}
	return filepath.Join(filepath.Dir(self), "testdata", b.name), nil
}

// compile builds the binary bin of the module in src, which pins version,
// with the go command: into a temporary directory beside bin, then renamed
// to bin, so that a binary at bin is always complete. The caller holds
// the lock of bin's directory, where the system has one.
func (b *pinnedBuild) compile(t testing.TB, src, version, bin string) error {
	t.Helper()
	goBin, err := goCommand()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(bin), "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, filepath.Base(bin))

	t.Logf("%s: building %s from %s into %s (once per machine; %s with a cold Go build cache)",
		b.name, version, src, bin, b.coldBuild)
	start := time.Now()
	cmd := exec.Command(goBin, "build", "-o", out, b.pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("GOWORK=off %s build -o %s %s in %s: %w\n%s",
			goBin, out, b.pkg, src, err, tail(output, 4<<10))
	}
	if err := os.Rename(out, bin); err != nil {
		// Where rename cannot replace a file (Windows, no lock), another
		// test binary may have put one there first: use it.
		if !isFile(bin) {
			return err
		}
	}
	t.Logf("%s: built %s in %v", b.name, bin, time.Since(start).Round(time.Millisecond))
	return nil
}

// cachePath returns where the build of version with source hash goes.
func (b *pinnedBuild) cachePath(version, hash string) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "dispatch-"+b.name, version+"-"+hash, b.name)
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	return bin
}

// sourceKey returns the version of b.module the module in src pins and a
// hash of the files the build depends on, so that a change of either
// builds anew.
func (b *pinnedBuild) sourceKey(src string) (version, hash string, err error) {
	h := sha256.New()
	for _, name := range b.files {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return "", "", fmt.Errorf("testdata/%s module (its source is needed to build %s): %w", b.name, b.name, err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
		if name == "go.mod" {
			version = requiredVersion(data, b.module)
		}
	}
	if version == "" {
		return "", "", fmt.Errorf("%s requires no %s", filepath.Join(src, "go.mod"), b.module)
	}
	return version, hex.EncodeToString(h.Sum(nil))[:12], nil
}

// requiredVersion returns the version that the go.mod text requires of
// module, or "".
func requiredVersion(gomod []byte, module string) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return ""
}

// goCommand returns the go command that built this test binary, else the
// one in $PATH (go test puts its own first there).
func goCommand() (string, error) {
	exe := ""
	if runtime.GOOS == "windows" {
		exe = ".exe"
	}
	//lint:ignore SA1019 runtime.GOROOT is deprecated for finding the running program's toolchain, but a test binary's is exactly the one wanted here.
	if root := runtime.GOROOT(); root != "" {
		if p := filepath.Join(root, "bin", "go"+exe); isFile(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("no go command to build the test servers with: " + err.Error())
	}
	return p, nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// tail returns at most the last n bytes of b, as text.
func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}
