package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// A repo is the repository's modules, as the working tree has them.
type repo struct {
	root    string // absolute
	version string // the release being prepared
	base    string // the root module's path
	modules []*mod // sorted by rel; the root module first
	work    *modfile.WorkFile
	readme  []byte
}

// A mod is one module of the repository.
type mod struct {
	rel       string // slash-separated directory from the root; "." for the root
	dir       string // absolute
	path      string
	published bool
	file      *modfile.File
	data      []byte // go.mod as it is on disk
}

// findRoot returns the directory of the go.work file the go command uses
// from the current directory.
func findRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOWORK: %w", err)
	}
	gowork := strings.TrimSpace(string(out))
	if gowork == "" || gowork == "off" {
		return "", errors.New("no go.work above the current directory: run from the repository or pass -root")
	}
	return filepath.Dir(gowork), nil
}

func loadRepo(root, version string) (*repo, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return nil, fmt.Errorf("-version %q is not a canonical semantic version", version)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	r := &repo{root: root, version: version}
	files, err := listFiles(root, ".")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if path.Base(f) != "go.mod" || inTestdata(f) {
			continue
		}
		m, err := loadMod(root, path.Dir(f))
		if err != nil {
			return nil, err
		}
		r.modules = append(r.modules, m)
	}
	slices.SortFunc(r.modules, func(a, b *mod) int { return strings.Compare(a.rel, b.rel) })
	if len(r.modules) == 0 || r.modules[0].rel != "." {
		return nil, fmt.Errorf("%s: no go.mod at the root", root)
	}
	r.base = r.modules[0].path

	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	if r.work, err = modfile.ParseWork("go.work", data, nil); err != nil {
		return nil, err
	}
	if r.readme, err = os.ReadFile(filepath.Join(root, "README.md")); err != nil {
		return nil, err
	}
	return r, nil
}

func loadMod(root, rel string) (*mod, error) {
	dir := filepath.Join(root, filepath.FromSlash(rel))
	name := path.Join(rel, "go.mod")
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, err
	}
	if f.Module == nil {
		return nil, fmt.Errorf("%s: no module line", name)
	}
	return &mod{rel: rel, dir: dir, path: f.Module.Mod.Path, published: !unpublished(f), file: f, data: data}, nil
}

// unpublished reports whether the comment above f's module line marks the
// module as never tagged.
func unpublished(f *modfile.File) bool {
	for _, c := range f.Module.Syntax.Before {
		if strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(c.Token, "//")), "Unpublished:") {
			return true
		}
	}
	return false
}

func inTestdata(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "testdata")
}

// listFiles returns the files under rel (slash-separated, relative to
// root) that a commit would hold: git's tracked files and the untracked
// ones it does not ignore, or, outside a git checkout, every file but .git.
// The paths are slash-separated and relative to root; files deleted from
// the working tree are left out.
func listFiles(root, rel string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", rel)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return walkFiles(root, rel)
	}
	var files []string
	for f := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); err == nil {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

func walkFiles(root, rel string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(filepath.Join(root, filepath.FromSlash(rel)), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			r, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(r))
		}
		return nil
	})
	return files, err
}

// published returns the published modules.
func (r *repo) published() []*mod {
	return slices.DeleteFunc(slices.Clone(r.modules), func(m *mod) bool { return !m.published })
}

// served returns the modules the proxy serves: the published ones, and the
// unpublished ones another module requires (a test harness shared by two
// modules, say), so that go mod tidy finds those too.
func (r *repo) served() []*mod {
	return slices.DeleteFunc(slices.Clone(r.modules), func(m *mod) bool { return !m.published && !r.required(m.path) })
}

// required reports whether one of our modules requires the module p.
func (r *repo) required(p string) bool {
	return slices.ContainsFunc(r.modules, func(m *mod) bool {
		return slices.ContainsFunc(m.file.Require, func(req *modfile.Require) bool { return req.Mod.Path == p })
	})
}

// module returns our module whose path is p, or nil.
func (r *repo) module(p string) *mod {
	i := slices.IndexFunc(r.modules, func(m *mod) bool { return m.path == p })
	if i < 0 {
		return nil
	}
	return r.modules[i]
}

func (r *repo) publishedPaths() string {
	var ps []string
	for _, m := range r.published() {
		ps = append(ps, m.path)
	}
	return strings.Join(ps, ", ")
}

// ours reports whether p is the path of one of our modules.
func (r *repo) ours(p string) bool { return r.module(p) != nil }

// lint checks what needs no go command: the go.mod and go.work files and
// the README's Install section.
func (r *repo) lint() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	uses := map[string]bool{}
	for _, u := range r.work.Use {
		uses[path.Clean(filepath.ToSlash(u.Path))] = true
	}
	for _, m := range r.modules {
		name := path.Join(m.rel, "go.mod")
		if !uses[m.rel] {
			bad("go.work does not use %s: the README's test command would not test it", m.rel)
		}
		for _, req := range m.file.Require {
			if r.ours(req.Mod.Path) && req.Mod.Version != r.version {
				bad("%s requires %s at %s, not at the release %s", name, req.Mod.Path, req.Mod.Version, r.version)
			}
		}
		for _, rep := range m.file.Replace {
			if r.ours(rep.Old.Path) {
				bad("%s replaces %s: go.work points our modules at the working tree", name, rep.Old.Path)
			}
		}
		if !m.published {
			continue
		}
		for _, rep := range m.file.Replace {
			bad("%s: published, yet replaces %s (a replace applies only in its own module, never for a user)", name, rep.Old.String())
		}
		for _, req := range m.file.Require {
			if dep := r.module(req.Mod.Path); dep != nil && !dep.published {
				bad("%s: published, yet requires %s, which is not (no user can fetch it)", name, dep.path)
			}
		}
		if want := path.Join(r.base, m.rel); m.path != want {
			bad("%s: published as %s, but its tag %s would publish %s", name, m.path, r.tag(m), want)
		}
		if err := module.Check(m.path, r.version); err != nil {
			bad("%s: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(m.dir, "LICENSE")); err != nil {
			bad("%s: published without a LICENSE beside it (its zip holds nothing above %s/)", name, m.rel)
		}
	}

	for _, m := range r.served() {
		if !slices.ContainsFunc(r.work.Replace, func(rep *modfile.Replace) bool {
			return rep.Old.Path == m.path && rep.Old.Version == r.version &&
				rep.New.Version == "" && path.Clean(filepath.ToSlash(rep.New.Path)) == m.rel
		}) {
			bad("go.work: missing replace %s %s => ./%s (the go command reads a workspace module's required version, golang/go#54264)",
				m.path, r.version, strings.TrimPrefix(m.rel, "."))
		}
	}

	lines, err := installLines(r.readme)
	if err != nil {
		return append(errs, fmt.Errorf("README.md: %w", err))
	}
	var got, want []string
	for _, l := range lines {
		got = append(got, l[2:]...)
	}
	for _, m := range r.published() {
		want = append(want, m.path+"@"+r.version)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		bad("README.md: Install gets %q; the published modules at the release are %q", got, want)
	}
	return errs
}

// tag returns the git tag that publishes m at the release version.
func (r *repo) tag(m *mod) string {
	if m.rel == "." {
		return r.version
	}
	return m.rel + "/" + r.version
}

// installLines returns the commands of the first sh block under the
// README's "Install" heading: each a go get, comments removed.
func installLines(readme []byte) ([][]string, error) {
	var lines [][]string
	section, block := false, false
	for l := range bytes.Lines(readme) {
		s := strings.TrimSpace(string(l))
		switch {
		case strings.HasPrefix(s, "#") && !block:
			section = strings.TrimSpace(strings.TrimLeft(s, "#")) == "Install"
		case section && !block && s == "```sh":
			block = true
		case block && s == "```":
			if len(lines) == 0 {
				return nil, errors.New(`the Install section's sh block has no go get line`)
			}
			return lines, nil
		case block:
			if i := strings.Index(s, "#"); i >= 0 {
				s = s[:i]
			}
			f := strings.Fields(s)
			if len(f) == 0 {
				continue
			}
			if len(f) < 3 || f[0] != "go" || f[1] != "get" || slices.ContainsFunc(f[2:], func(a string) bool { return strings.HasPrefix(a, "-") }) {
				return nil, fmt.Errorf("the Install section runs %q: only plain go get lines belong there", s)
			}
			lines = append(lines, f)
		}
	}
	return nil, errors.New("no sh block under an Install heading")
}
