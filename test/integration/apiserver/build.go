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

// etcdModule is the module, required by testdata/etcd/go.mod, whose
// version names the etcd that [buildEtcd] builds.
const etcdModule = "go.etcd.io/etcd/server/v3"

// etcdBuild memoizes [buildEtcd] for the test binary: its first caller
// builds (or finds) etcd, the others get the same path or error.
var etcdBuild struct {
	mu   sync.Mutex
	done bool
	path string
	err  error
}

// builtEtcd returns the path of the etcd that [buildEtcd] builds, building
// it at most once per test binary.
func builtEtcd(t testing.TB) (string, error) {
	t.Helper()
	etcdBuild.mu.Lock()
	defer etcdBuild.mu.Unlock()
	if !etcdBuild.done {
		etcdBuild.path, etcdBuild.err = buildEtcd(t)
		etcdBuild.done = true
	}
	return etcdBuild.path, etcdBuild.err
}

// buildEtcd builds the module in testdata/etcd — etcd's own main package
// at the release its go.mod pins — with the go command, outside the
// workspace (GOWORK=off), into the user's cache directory:
// dispatch-etcd/VERSION-HASH/etcd under [os.UserCacheDir], where HASH
// covers the module's go.mod, go.sum and main.go. A binary already there is
// reused, so a machine builds each pinned etcd once (under a minute on two
// cores with empty Go build and module caches: 55 s measured).
//
// Test binaries run in parallel (go test runs packages at once), so the
// build holds a file lock in that directory where the system has flock(2),
// and writes to a temporary name renamed into place: a binary at the final
// path is always complete.
//
// The module's source is found next to this file's, through
// runtime.Caller: the tests run from a source checkout.
func buildEtcd(t testing.TB) (string, error) {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the etcd build module: runtime.Caller failed")
	}
	src := filepath.Join(filepath.Dir(self), "testdata", "etcd")
	version, hash, err := etcdSourceKey(src)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "dispatch-etcd", version+"-"+hash)
	bin := filepath.Join(dir, "etcd")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if isFile(bin) {
		t.Logf("etcd: no etcd in $%s or $PATH: using %s, built earlier from %s", EtcdBinaryEnv, bin, src)
		return bin, nil
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if isFile(bin) { // another test binary built it while this one waited
		t.Logf("etcd: no etcd in $%s or $PATH: using %s, built by another test binary", EtcdBinaryEnv, bin)
		return bin, nil
	}

	goBin, err := goCommand()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, filepath.Base(bin))

	t.Logf("etcd: no etcd in $%s or $PATH: building etcd %s from %s into %s "+
		"(once per machine; about a minute or more on a cold Go build cache)",
		EtcdBinaryEnv, version, src, bin)
	start := time.Now()
	cmd := exec.Command(goBin, "build", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	output, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("GOWORK=off %s build -o %s . in %s: %w\n%s",
			goBin, out, src, err, tail(output, 4<<10))
	}
	if err := os.Rename(out, bin); err != nil {
		// Where rename cannot replace a file (Windows, no lock), another
		// test binary may have put one there first: use it.
		if !isFile(bin) {
			return "", err
		}
	}
	t.Logf("etcd: built %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return bin, nil
}

// etcdSourceKey returns the etcd version the module in src pins and a hash
// of the files the build depends on, so that a change of either builds anew.
func etcdSourceKey(src string) (version, hash string, err error) {
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return "", "", fmt.Errorf("testdata/etcd module (its source is needed to build etcd): %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
		if name == "go.mod" {
			version = requiredVersion(b, etcdModule)
		}
	}
	if version == "" {
		return "", "", fmt.Errorf("%s requires no %s", filepath.Join(src, "go.mod"), etcdModule)
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
		return "", fmt.Errorf("no go command to build etcd with: %w", err)
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
