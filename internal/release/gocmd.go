package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// A work is a temporary directory: the proxy, a module cache of its own, the
// consumer's module. The go commands run here see our modules only through
// the proxy.
//
// The module cache is a fresh one because the machine's is shared and
// immutable: a module version once extracted there is never fetched again,
// so a v0.1.0 made from today's tree would be used in place of tomorrow's,
// by every build on the machine that asks for it. The machine's cache still
// serves every other module, as a file:// proxy ahead of the usual one.
type work struct {
	dir      string
	proxy    string // the proxy directory buildProxy writes
	modcache string // GOMODCACHE of the go commands run here
	goproxy  string // GOPROXY of the go commands run here
}

func newWork() (*work, error) {
	dir, err := os.MkdirTemp("", "dispatch-release-")
	if err != nil {
		return nil, err
	}
	w := &work{dir: dir, proxy: filepath.Join(dir, "proxy"), modcache: filepath.Join(dir, "modcache")}
	proxies := []string{fileURL(w.proxy)}
	if cache, err := goEnv("GOMODCACHE"); err == nil && cache != "" {
		if _, err := os.Stat(filepath.Join(cache, "cache", "download")); err == nil {
			proxies = append(proxies, fileURL(filepath.Join(cache, "cache", "download")))
		}
	}
	usual, err := goEnv("GOPROXY")
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	if usual != "" {
		proxies = append(proxies, usual)
	}
	w.goproxy = strings.Join(proxies, ",")
	return w, nil
}

// remove removes the directory; the module cache's files are read-only, so
// go clean empties it first.
func (w *work) remove() error {
	var err error
	if _, serr := os.Stat(w.modcache); serr == nil {
		cmd := exec.Command("go", "clean", "-modcache")
		cmd.Dir = w.dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOMODCACHE="+w.modcache)
		if out, cerr := cmd.CombinedOutput(); cerr != nil {
			err = fmt.Errorf("go clean -modcache: %w\n%s", cerr, out)
		}
	}
	return errors.Join(err, os.RemoveAll(w.dir))
}

// env is the environment of the go commands run in w: no workspace, our
// proxy first, its own module cache, our modules unknown to the checksum
// database (the proxy's zips are the working tree's, not a tag's), and
// -mod=mod, with which a first build records what it needs as a user's does.
func (r *repo) env(w *work) []string {
	set := map[string]string{
		"GOWORK":     "off",
		"GOPROXY":    w.goproxy,
		"GOMODCACHE": w.modcache,
		"GONOSUMDB":  r.base,
		"GONOPROXY":  "",
		"GOPRIVATE":  "",
		"GOFLAGS":    "-mod=mod",
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// goIn runs go with args in dir under r.env(w) and returns its standard
// output. The error carries its standard error.
func (r *repo) goIn(ctx context.Context, w *work, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = r.env(w)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return stdout.String(), nil
}

func goEnv(key string) (string, error) {
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", key, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// fileURL is the file:// URL of the directory dir.
func fileURL(dir string) string {
	p := filepath.ToSlash(dir)
	if !strings.HasPrefix(p, "/") {
		p = "/" + p // a Windows drive letter
	}
	return (&url.URL{Scheme: "file", Path: p}).String()
}

// within reports whether p is dir or below it.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
