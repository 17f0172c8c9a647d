package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// buildProxy writes a module proxy directory (the GOPROXY file:// layout:
// <path>/@v/list, <version>.info, .mod and .zip) serving every published
// module at the release version, made from the working tree as a commit of
// it would be tagged, and the unpublished modules that another requires.
func (r *repo) buildProxy(dir string) error {
	t := r.commitTime()
	for _, m := range r.served() {
		if err := r.writeModule(dir, m, t); err != nil {
			return fmt.Errorf("%s: %w", m.path, err)
		}
	}
	return nil
}

func (r *repo) writeModule(dir string, m *mod, t time.Time) error {
	escaped, err := module.EscapePath(m.path)
	if err != nil {
		return err
	}
	v := module.Version{Path: m.path, Version: r.version}
	vdir := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	files, err := r.zipFiles(m)
	if err != nil {
		return err
	}
	// CheckFiles reports what Create would refuse, or what the proxy would:
	// bad names, case collisions, more than zip.MaxZipFile bytes.
	cf, err := zip.CheckFiles(files)
	if err != nil {
		return fmt.Errorf("module zip: %w", err)
	}
	if !slices.Contains(cf.Valid, "go.mod") || m.published && !slices.Contains(cf.Valid, "LICENSE") {
		return fmt.Errorf("module zip lacks go.mod or LICENSE (has %d files)", len(cf.Valid))
	}
	zf, err := os.Create(filepath.Join(vdir, r.version+".zip"))
	if err != nil {
		return err
	}
	if err := zip.Create(zf, v, files); err != nil {
		zf.Close()
		return fmt.Errorf("module zip: %w", err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{r.version, t})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, r.version+".info"), info, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, r.version+".mod"), m.data, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(vdir, "list"), []byte(r.version+"\n"), 0o644)
}

// zipFiles returns the files of m's directory that a commit holds, nested
// modules' go.mod files included so that zip leaves those modules out.
func (r *repo) zipFiles(m *mod) ([]zip.File, error) {
	paths, err := listFiles(r.root, m.rel)
	if err != nil {
		return nil, err
	}
	var files []zip.File
	for _, p := range paths {
		rel := p
		if m.rel != "." {
			rel = strings.TrimPrefix(p, m.rel+"/")
		}
		files = append(files, diskFile{rel: rel, abs: filepath.Join(r.root, filepath.FromSlash(p))})
	}
	return files, nil
}

// A diskFile is a file of the working tree, as golang.org/x/mod/zip sees it.
type diskFile struct{ rel, abs string }

func (f diskFile) Path() string                 { return path.Clean(f.rel) }
func (f diskFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// commitTime is the time of the commit the working tree is at, or now
// outside a git checkout: the time the proxy gives the release.
func (r *repo) commitTime() time.Time {
	cmd := exec.Command("git", "log", "-1", "--format=%cI")
	cmd.Dir = r.root
	if out, err := cmd.Output(); err == nil {
		if t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(out))); err == nil {
			return t.UTC()
		}
	}
	return time.Now().UTC().Truncate(time.Second)
}
