package dispatchprom

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVocabulariesAreTheCores ties the label values of labels.go to the
// core's own lists, so that a value the core adds fails here until the
// Observer exports it by name rather than as "other".
//
// The mode-change reasons have no exported list: they are the constants
// the core sends (reason… in the root package, Reason… in
// internal/fallback), and the core's documentation names each
// (Observer.OnModeChange, FallbackPolicy's fields). Both are read from the
// core's source, and must agree with each other and with knownSwitches.
// The bounds are the core's constants of type Bound. The states, circuit
// states and modes are the values the core names (String).
func TestVocabulariesAreTheCores(t *testing.T) {
	root, fallback := coreDirs(t)
	fset := token.NewFileSet()
	rootFiles, fallbackFiles := parseDir(t, fset, root), parseDir(t, fset, fallback)

	t.Run("mode-change reasons", func(t *testing.T) {
		sent := stringConsts(rootFiles, func(name, _ string) bool { return strings.HasPrefix(name, "reason") })
		maps.Copy(sent, stringConsts(fallbackFiles, func(name, _ string) bool { return strings.HasPrefix(name, "Reason") }))
		documented := documentedReasons(t, rootFiles)
		require.NotEmpty(t, sent)
		assert.Equal(t, keys(sent), keys(documented), "the reasons the core sends are those its documentation names")
		assert.Equal(t, keys(sent), keys(knownSwitches), "knownSwitches is the core's list")
		for r := range sent {
			assert.Equal(t, r, switchReason(r))
		}
	})
	t.Run("bounds", func(t *testing.T) {
		bounds := stringConsts(rootFiles, func(_, typ string) bool { return typ == "Bound" })
		require.NotEmpty(t, bounds)
		assert.Equal(t, keys(bounds), keys(knownBounds), "knownBounds is the core's Bound constants")
		for b := range knownBounds {
			assert.Equal(t, string(b), rejectReason(&dispatch.BackpressureError{Bound: b}))
			assert.Equal(t, string(b), dropReason(b))
		}
	})
	t.Run("states, circuits, modes", func(t *testing.T) {
		for i := range 256 {
			if s := dispatch.State(i); !strings.HasPrefix(s.String(), "state_") {
				assert.Equal(t, s.String(), result(s), "the core's state %d", i)
			}
			if c := dispatch.Circuit(i); !strings.HasPrefix(c.String(), "circuit_") {
				assert.Equal(t, c.String(), breakerValue(c), "the core's circuit state %d", i)
			}
			if m := dispatch.Mode(i); !strings.HasPrefix(m.String(), "mode_") {
				assert.Equal(t, m.String(), modeValue(m), "the core's mode %d", i)
			}
		}
	})
}

// coreDirs returns the source directories of the core's root package and
// of its internal/fallback, as the build that runs this test sees them
// (the workspace, or the module cache).
func coreDirs(t *testing.T) (root, fallback string) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}",
		"github.com/coalescer/dispatch", "github.com/coalescer/dispatch/internal/fallback").Output()
	require.NoError(t, err, "go list the core's packages")
	dirs := strings.Fields(string(out))
	require.Len(t, dirs, 2)
	return dirs[0], dirs[1]
}

// parseDir parses the non-test Go files of dir, with their comments.
func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	require.NotEmpty(t, files, "no Go files in %s", dir)
	return files
}

// stringConsts returns the values of the string constants that keep
// chooses, by name and declared type ("" if none).
func stringConsts(files []*ast.File, keep func(name, typ string) bool) map[string]bool {
	out := map[string]bool{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				for i, name := range vs.Names {
					if i >= len(vs.Values) || !keep(name.Name, typ) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out[v] = true
					}
				}
			}
		}
	}
	return out
}

// quoted finds the "word" quotations of a comment.
var quoted = regexp.MustCompile(`"([a-z_]+)"`)

// documentedReasons returns the reasons the core's documentation names:
// those quoted in Observer.OnModeChange's comment and in the comments of
// FallbackPolicy's fields.
func documentedReasons(t *testing.T, files []*ast.File) map[string]bool {
	out := map[string]bool{}
	add := func(cgs ...*ast.CommentGroup) {
		for _, cg := range cgs {
			for _, m := range quoted.FindAllStringSubmatch(cg.Text(), -1) {
				out[m[1]] = true
			}
		}
	}
	var found []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			switch typ := ts.Type.(type) {
			case *ast.StructType:
				if ts.Name.Name == "FallbackPolicy" {
					found = append(found, ts.Name.Name)
					for _, field := range typ.Fields.List {
						add(field.Doc, field.Comment)
					}
				}
			case *ast.InterfaceType:
				if ts.Name.Name == "Observer" {
					for _, m := range typ.Methods.List {
						if len(m.Names) == 1 && m.Names[0].Name == "OnModeChange" {
							found = append(found, "Observer.OnModeChange")
							add(m.Doc, m.Comment)
						}
					}
				}
			}
			return false
		})
	}
	require.ElementsMatch(t, []string{"FallbackPolicy", "Observer.OnModeChange"}, found, "where the core documents its reasons")
	return out
}

// keys returns m's keys as sorted strings.
func keys[S ~string](m map[S]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}
