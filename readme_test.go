package dispatch

import (
	"context"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's claims and snippets, held to the code. Each test reads the
// README as it is (docSays, readmeSnippet), so a sentence reworded or a
// snippet changed fails here rather than leaving a test of a promise no
// longer made.

// readmeSnippet returns the first ```go block of the README's section
// headed "## "+section.
func readmeSnippet(t *testing.T, section string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n## "+section+"\n")
	require.True(t, ok, "README.md has no section %q", section)
	rest, _, _ = strings.Cut(rest, "\n## ")
	_, rest, ok = strings.Cut(rest, "```go\n")
	require.True(t, ok, "README.md's %q has no Go snippet", section)
	code, _, ok := strings.Cut(rest, "```")
	require.True(t, ok, "README.md's %q: unterminated snippet", section)
	return code
}

// snippetImporter type-checks imports from source (this module and its
// dependencies), and stands in for k8s.io/apimachinery's types package,
// whose UID the README's Rolling out snippet keys by, with a package
// declaring only that (a string type, as upstream's).
type snippetImporter struct{ src types.ImporterFrom }

func (i snippetImporter) Import(path string) (*types.Package, error) {
	return i.ImportFrom(path, ".", 0)
}

func (i snippetImporter) ImportFrom(path, dir string, mode types.ImportMode) (*types.Package, error) {
	if path != "k8s.io/apimachinery/pkg/types" {
		return i.src.ImportFrom(path, dir, mode)
	}
	p := types.NewPackage(path, "types")
	uid := types.NewTypeName(token.NoPos, p, "UID", nil)
	types.NewNamed(uid, types.Typ[types.String], nil)
	p.Scope().Insert(uid)
	p.MarkComplete()
	return p, nil
}

// snippetFset and snippetImports are shared by every check, so that the
// module is type-checked from source once per test binary.
var (
	snippetFset    = token.NewFileSet()
	snippetImports = sync.OnceValue(func() types.ImporterFrom {
		return snippetImporter{importer.ForCompiler(snippetFset, "source", nil).(types.ImporterFrom)}
	})
	snippetMu sync.Mutex
)

// typeCheck type-checks src, a file of package snippet.
func typeCheck(t *testing.T, src string) {
	t.Helper()
	snippetMu.Lock()
	defer snippetMu.Unlock()
	f, err := parser.ParseFile(snippetFset, "snippet.go", src, parser.SkipObjectResolution)
	require.NoError(t, err, "%s", src)
	var errs []string
	conf := types.Config{Importer: snippetImports(), Error: func(err error) { errs = append(errs, err.Error()) }}
	_, _ = conf.Check("snippet", snippetFset, []*ast.File{f}, nil)
	require.Empty(t, errs, "the snippet does not compile:\n%s", src)
}

// TestReadmeQuickStartCompiles: the Quick start snippet compiles against
// the current API, as written: its declarations at the top level, its
// statements in a function that has the names it leaves to the reader
// (apiWrite, uid, attempt, ctx).
func TestReadmeQuickStartCompiles(t *testing.T) {
	code := readmeSnippet(t, "Quick start")
	var decls, body []string
	lines := strings.Split(code, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "d, err := dispatch.New(") {
			decls, body = lines[:i], lines[i:]
			break
		}
	}
	require.NotEmpty(t, body, "the snippet creates its dispatcher with d, err := dispatch.New(")
	var kept []string
	for _, l := range decls {
		if strings.HasPrefix(l, "import ") {
			require.Equal(t, `import "github.com/coalescer/dispatch"`, l)
			continue // the file's imports, below, include it
		}
		kept = append(kept, l)
	}
	typeCheck(t, `package snippet

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/coalescer/dispatch"
	"golang.org/x/time/rate"
)

`+strings.Join(kept, "\n")+`

func apiWrite(context.Context, string, Op) error { return nil }

func quickStart(ctx context.Context, uid string, attempt uint64) error {
`+strings.Join(body, "\n")+`
	return nil
}
`)
}

// TestReadmeRollingOutCompiles: the Rolling out snippet compiles against
// the current API, with the names it leaves to the reader (exec, Op, the
// gate, the observer, the label function, ctx) as parameters.
func TestReadmeRollingOutCompiles(t *testing.T) {
	code := readmeSnippet(t, "Rolling out")
	typeCheck(t, `package snippet

import (
	"context"
	"time"

	"github.com/coalescer/dispatch"
	"k8s.io/apimachinery/pkg/types"
)

type Op struct{}

type featureGates map[string]bool

func rollingOut(ctx context.Context, exec dispatch.ExecFunc[types.UID, Op], gates featureGates,
	modeFromGate func(featureGates) dispatch.Mode, metrics dispatch.Observer, callType func(types.UID, Op) string) error {
`+code+`
	return err
}
`)
}

// TestReadmeReservedWorkersByBand: the reservation is for calls in
// UrgentPriority's band or above, judged on priority, never on age. With
// bands of 10 and UrgentPriority 15, a call at 10 takes the kept worker,
// and one at 9, however long it has waited, does not.
func TestReadmeReservedWorkersByBand(t *testing.T) {
	docSays(t, "README.md", "`ReservedWorkers` are kept for calls in `UrgentPriority`'s band or above (judged on priority, never on age)")
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		d := newD(t, func(ctx context.Context, _ string, _ int) error { return g.wait(ctx) }, Config[string, int]{
			Workers: 2, AgingBand: 10, Aging: time.Second,
			Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: 15},
		})
		tks := []*Ticket[string, int]{submit(t, d, "a", 0, prio(9)), submit(t, d, "b", 0, prio(9))}
		time.Sleep(time.Minute) // b, waiting, ages far past 15
		synctest.Wait()
		assert.Equal(t, 1, d.Stats().InFlight, "an aged call below the band took the kept worker")
		tks = append(tks, submit(t, d, "urgent", 0, prio(10)))
		synctest.Wait()
		assert.Equal(t, 2, d.Stats().InFlight, "a call in UrgentPriority's band, below UrgentPriority, did not take the kept worker")
		g.open()
		waitAll(tks...)
		closeD(t, d)
	})
}
