package dispatch

import (
	"context"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch/internal/fallback"
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
	_, rest, ok := strings.Cut(readmeSection(t, section), "```go\n")
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

// TestReadmeWatchTableNamesExist: every name the Rolling out section's
// table of signals sends a reader to exists: each Stats().X, each Stats
// field after it, each Observer method, and the Bound that keys
// Backpressure; and the fallback's reasons are the ones its observer is
// told.
func TestReadmeWatchTableNamesExist(t *testing.T) {
	docSays(t, "README.md", "tells the observer (`OnModeChange`, with the threshold's reason: `\"backlog\"`, `\"queue_wait\"`, `\"failure_ratio\"` or `\"circuit_open\"`)")
	assert.ElementsMatch(t, []string{"backlog", "queue_wait", "failure_ratio", "circuit_open"},
		[]string{fallback.ReasonBacklog, fallback.ReasonQueueWait, fallback.ReasonFailureRatio, fallback.ReasonCircuitOpen})

	section := readmeSection(t, "Rolling out")
	_, table, ok := strings.Cut(section, "| signal | where | what it tells you |")
	require.True(t, ok, "the Rolling out section has its table of signals")
	table, _, _ = strings.Cut(table, "\n\n")
	stats, observer := reflect.TypeFor[Stats](), reflect.TypeFor[Observer]()
	tick := regexp.MustCompile("`([^`]+)`")
	rows := 0
	for row := range strings.SplitSeq(strings.TrimSpace(table), "\n") {
		cols := strings.Split(row, "|")
		if len(cols) < 4 || strings.HasPrefix(cols[2], "---") {
			continue
		}
		rows++
		for _, m := range tick.FindAllStringSubmatch(cols[2], -1) {
			for name := range strings.SplitSeq(m[1], " + ") {
				name = strings.TrimPrefix(name, "Stats().")
				name, _, _ = strings.Cut(name, "[")
				name, _, _ = strings.Cut(name, "'s")
				switch {
				case name == "Bound":
					assert.Equal(t, reflect.TypeFor[Bound](), stats.Field(fieldIndex(t, stats, "Backpressure")).Type.Key())
				case strings.HasPrefix(name, "On"):
					_, ok := observer.MethodByName(name)
					assert.True(t, ok, "the table names Observer.%s (row %q)", name, cols[1])
				default:
					_, ok := stats.FieldByName(name)
					assert.True(t, ok, "the table names Stats.%s (row %q)", name, cols[1])
				}
			}
		}
	}
	assert.Equal(t, 10, rows, "the table's rows")
}

// fieldIndex returns the index of typ's field name.
func fieldIndex(t *testing.T, typ reflect.Type, name string) int {
	t.Helper()
	f, ok := typ.FieldByName(name)
	require.True(t, ok, "%s has no field %s", typ, name)
	return f.Index[0]
}

// readmeSection returns the README's section headed "## "+name, to the
// next such heading.
func readmeSection(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n## "+name+"\n")
	require.True(t, ok, "README.md has no section %q", name)
	rest, _, _ = strings.Cut(rest, "\n## ")
	return rest
}
