// Command apisize measures what issue 21 bounds in a Go package: its
// exported top-level names (and how many are constants), the length of
// `go doc -all`, the functions longer than 40 lines and those with more
// than 6 parameters. Run it from the repository root:
//
//	go run ./internal/apisize          # the core package
//	go run ./internal/apisize ./kube   # another package directory
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"sort"
	"strings"
)

func main() {
	long := flag.Int("long", 40, "report functions longer than this many lines")
	params := flag.Int("params", 6, "report functions with more parameters than this")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	if err := run(dir, *long, *params); err != nil {
		fmt.Fprintln(os.Stderr, "apisize:", err)
		os.Exit(1)
	}
}

func run(dir string, long, maxParams int) error {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		return err
	}
	var names, consts int
	type fn struct {
		name         string
		lines, param int
	}
	var fns []fn
	for _, p := range pkgs {
		for _, f := range p.Files {
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
									if d.Tok == token.CONST {
										consts++
									}
								}
							}
						}
					}
				case *ast.FuncDecl:
					if d.Recv == nil && d.Name.IsExported() {
						names++
					}
					name := d.Name.Name
					if d.Recv != nil && len(d.Recv.List) > 0 {
						name = recvName(d.Recv.List[0].Type) + "." + name
					}
					n := 0
					for _, f := range d.Type.Params.List {
						n += max(len(f.Names), 1)
					}
					lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
					fns = append(fns, fn{name, lines, n})
				}
			}
		}
	}
	out, err := exec.Command("go", "doc", "-all", dir).Output()
	if err != nil {
		return fmt.Errorf("go doc -all %s: %w", dir, err)
	}
	fmt.Printf("exported top-level names: %d (%d constants)\n", names, consts)
	fmt.Printf("go doc -all lines: %d\n", bytes.Count(out, []byte("\n")))
	sort.Slice(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	var longFns, manyParams []string
	for _, f := range fns {
		if f.lines > long {
			longFns = append(longFns, fmt.Sprintf("%s %d", f.name, f.lines))
		}
		if f.param > maxParams {
			manyParams = append(manyParams, fmt.Sprintf("%s %d", f.name, f.param))
		}
	}
	fmt.Printf("functions over %d lines: %d %v\n", long, len(longFns), longFns)
	fmt.Printf("functions with more than %d parameters: %d %v\n", maxParams, len(manyParams), manyParams)
	return nil
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
