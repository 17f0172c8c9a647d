// Command apisize measures the shape of every module of this repository:
// what a user reads (exported names and `go doc -all` lines of each
// published module), what a maintainer reads (functions longer than 40
// lines or with more than 6 parameters, in every non-test file of every
// module), how the core's files lean on each other (file pairs that call
// each other both ways, methods on *Dispatcher), exported Default*
// constants in the adapters, and internal tracker numbers left in Markdown
// and comments. Run it from the repository root:
//
//	go run ./internal/apisize
//
// A module is published unless the comment above its go.mod's module line
// starts with "Unpublished:" (as the release check reads it).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

const (
	longLines = 40 // a function longer than this is reported
	maxParams = 6  // a function with more parameters is reported
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "apisize:", err)
		os.Exit(1)
	}
}

type module struct {
	Path, Dir string
	published bool
}

func run() error {
	mods, err := modules()
	if err != nil {
		return err
	}
	root, _ := os.Getwd()
	fmt.Println("| module | published | exported names | go doc lines | funcs > 40 lines | funcs > 6 params | Default* exports |")
	fmt.Println("|---|---|---|---|---|---|---|")
	var pubNames, pubDoc int
	var details []string
	for _, m := range mods {
		sh, err := measure(root, m)
		if err != nil {
			return err
		}
		if m.published {
			pubNames += sh.names
			pubDoc += sh.doc
		}
		rel, _ := filepath.Rel(root, m.Dir)
		pub := map[bool]string{true: "yes", false: "no"}[m.published]
		fmt.Printf("| %s | %s | %d | %d | %d | %d | %d |\n", "./"+strings.TrimPrefix(rel, "."), pub, sh.names, sh.doc, len(sh.long), len(sh.params), sh.defaults)
		if len(sh.long) > 0 || len(sh.params) > 0 {
			details = append(details, fmt.Sprintf("%s: over %d lines %v; over %d params %v", "./"+rel, longLines, sh.long, maxParams, sh.params))
		}
	}
	fmt.Printf("\npublished modules together: %d exported names, %d go doc lines\n", pubNames, pubDoc)
	for _, d := range details {
		fmt.Println("  " + d)
	}
	if err := printCore(root); err != nil {
		return err
	}
	return printTrackers(root)
}

// shape is what apisize measures of one module.
type shape struct {
	names, doc, defaults int      // exported names, go doc -all lines, Default* exports
	long, params         []string // functions too long, or with too many parameters
}

// measure measures module m: every package's functions, and, if m is
// published, its packages' exported names and go doc lines (internal and
// main packages excepted).
func measure(root string, m module) (shape, error) {
	var sh shape
	pkgs, err := packages(m.Dir)
	if err != nil {
		return sh, err
	}
	for _, p := range pkgs {
		files, fset, err := parse(p, false)
		if err != nil {
			return sh, err
		}
		rel, _ := filepath.Rel(root, p)
		l, pa := funcShape(fset, files, rel)
		sh.long, sh.params = append(sh.long, l...), append(sh.params, pa...)
		if !m.published || isInternal(m.Dir, p) || isMain(files) {
			continue
		}
		n, d := exported(files)
		sh.names += n
		sh.defaults += d
		out, err := exec.Command("go", "doc", "-all", p).Output()
		if err != nil {
			return sh, fmt.Errorf("go doc -all %s: %w", p, err)
		}
		sh.doc += bytes.Count(out, []byte("\n"))
	}
	return sh, nil
}

// printCore prints the core's methods on *Dispatcher and its file pairs
// that call each other both ways.
func printCore(root string) error {
	pairs, methods, err := coreCalls(root)
	if err != nil {
		return err
	}
	fmt.Printf("\ncore: methods on *Dispatcher: %d\n", methods)
	fmt.Printf("core: file pairs that call each other both ways: %d\n", len(pairs))
	for _, p := range pairs {
		fmt.Println("  " + p)
	}
	return nil
}

// printTrackers prints the internal tracker numbers in Markdown and
// comments.
func printTrackers(root string) error {
	hits, err := trackerNumbers(root)
	if err != nil {
		return err
	}
	fmt.Printf("\ninternal tracker numbers in Markdown and comments: %d\n", len(hits))
	for _, h := range hits {
		fmt.Println("  " + h)
	}
	return nil
}

// modules lists the workspace's modules, and which are published.
func modules() ([]module, error) {
	out, err := exec.Command("go", "list", "-m", "-json").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	var mods []module
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var m module
		if err := dec.Decode(&m); err != nil {
			return nil, err
		}
		mod, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		m.published = !unpublished(mod)
		mods = append(mods, m)
	}
	return mods, nil
}

// unpublished reports whether the comment above a go.mod's module line
// starts with "Unpublished:".
func unpublished(mod []byte) bool {
	var comment []string
	sc := bufio.NewScanner(bytes.NewReader(mod))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "//"):
			comment = append(comment, strings.TrimSpace(strings.TrimPrefix(line, "//")))
		case strings.HasPrefix(line, "module "):
			return len(comment) > 0 && strings.HasPrefix(comment[0], "Unpublished:")
		case line == "":
		default:
			comment = nil
		}
	}
	return false
}

// packages lists the directories of a module that hold Go files, leaving
// out nested modules and testdata.
func packages(dir string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if p != dir && (name == "testdata" || strings.HasPrefix(name, ".") || exists(filepath.Join(p, "go.mod"))) {
			return filepath.SkipDir
		}
		if m, _ := filepath.Glob(filepath.Join(p, "*.go")); len(m) > 0 {
			dirs = append(dirs, p)
		}
		return nil
	})
	return dirs, err
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func isInternal(modDir, p string) bool {
	rel, _ := filepath.Rel(modDir, p)
	return slices.Contains(strings.Split(rel, string(filepath.Separator)), "internal") || strings.HasPrefix(rel, "examples")
}

func isMain(files []*ast.File) bool { return len(files) > 0 && files[0].Name.Name == "main" }

// parse reads a package directory's non-test Go files (tests too if
// tests).
func parse(dir string, tests bool) ([]*ast.File, *token.FileSet, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || !tests && strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
	}
	return files, fset, nil
}

// exported counts a package's exported top-level names, and the constants
// among them named Default*.
func exported(files []*ast.File) (names, defaults int) {
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names++
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names++
								if strings.HasPrefix(n.Name, "Default") && d.Tok == token.CONST {
									defaults++
								}
							}
						}
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names++
				}
			}
		}
	}
	return names, defaults
}

// funcShape reports the functions longer than longLines and those with
// more than maxParams parameters.
func funcShape(fset *token.FileSet, files []*ast.File, rel string) (long, params []string) {
	for _, f := range files {
		for _, decl := range f.Decls {
			d, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) > 0 {
				name = recvName(d.Recv.List[0].Type) + "." + name
			}
			name = rel + ":" + name
			n := 0
			for _, f := range d.Type.Params.List {
				n += max(len(f.Names), 1)
			}
			if lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1; lines > longLines {
				long = append(long, fmt.Sprintf("%s %d", name, lines))
			}
			if n > maxParams {
				params = append(params, fmt.Sprintf("%s %d", name, n))
			}
		}
	}
	return long, params
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// coreCalls type-checks the core package (root directory) and returns the
// pairs of its non-test files that each use a function or method the
// other declares, and the number of methods declared on Dispatcher.
func coreCalls(root string) (pairs []string, methods int, err error) {
	files, fset, err := parse(root, false)
	if err != nil {
		return nil, 0, err
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(error) {}}
	_, _ = conf.Check("dispatch", fset, files, info) // errors tolerated: in-package uses resolve
	base := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	uses := map[[2]string]bool{}
	for id, obj := range info.Uses {
		fn, ok := obj.(*types.Func)
		if !ok || fn.Pkg() == nil || fn.Pkg().Path() != "dispatch" {
			continue
		}
		from, to := base(id.Pos()), base(fn.Origin().Pos())
		if from != to {
			uses[[2]string{from, to}] = true
		}
	}
	for k := range uses {
		if k[0] < k[1] && uses[[2]string{k[1], k[0]}] {
			pairs = append(pairs, k[0]+" <-> "+k[1])
		}
	}
	sort.Strings(pairs)
	for _, f := range files {
		for _, decl := range f.Decls {
			if d, ok := decl.(*ast.FuncDecl); ok && d.Recv != nil && recvName(d.Recv.List[0].Type) == "Dispatcher" {
				methods++
			}
		}
	}
	return pairs, methods, nil
}

// trackerRef is how an internal tracker number reads in prose.
var trackerRef = regexp.MustCompile(`\b[Ii]ssues? [0-9]{1,3}\b`)

// trackerNumbers finds internal tracker numbers in Markdown files and in Go
// comments (an upstream reference, owner/repo#N, is not one).
func trackerNumbers(root string) ([]string, error) {
	var hits []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".md") && !strings.HasSuffix(p, ".go") {
			return nil
		}
		text, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for i, line := range strings.Split(string(text), "\n") {
			if strings.HasSuffix(p, ".go") {
				c := strings.Index(line, "//")
				if c < 0 {
					continue
				}
				line = line[c:]
			}
			if trackerRef.MatchString(line) {
				hits = append(hits, fmt.Sprintf("%s:%d", rel, i+1))
			}
		}
		return nil
	})
	return hits, err
}
