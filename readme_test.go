package dispatch

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"math"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch/internal/fallback"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
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

// TestReadmeKeysAndCoalescing holds Semantics in brief's "Keys and
// coalescing", sentence by sentence. One worker, held by another key, keeps
// each key's call pending while the next submission arrives.
func TestReadmeKeysAndCoalescing(t *testing.T) {
	docSays(t, "README.md", "calls with the same key are serialized, with at most one running and one pending.")
	docSays(t, "README.md", "skip the incoming one as moot (`SkipIncoming`: it ends `StateSkipped` at once), or refuse (`ErrMergeRejected`; the pending call is untouched). Without a merge function the newest call replaces the pending one. Every submission merged into a call shares its one outcome. A submission while the key's call runs becomes the pending successor and keeps its place in line.")
	docSays(t, "README.md", "Calls are never merged across generations or idempotency keys.")
	refuse := errors.New("no")
	// held starts a dispatcher whose one worker is held by "hold" until
	// the returned gate opens.
	held := func(t *testing.T, merge func(int, int) (int, error)) (*Dispatcher[string, int], *fixture[string, int], *gate) {
		f := newFixture[string, int]()
		g := f.block("hold")
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Merge: merge})
		require.NoError(t, d.Post("hold", 0, SubmitOptions{}))
		synctest.Wait()
		return d, f, g
	}
	t.Run("no merge function: the newest replaces, one outcome", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, f, g := held(t, nil)
			a, b := submit(t, d, "k", 1, SubmitOptions{}), submit(t, d, "k", 2, SubmitOptions{})
			g.open()
			waitAll(a, b)
			assert.Equal(t, []int{2}, f.calls("k"))
			assert.Equal(t, outcome(t, a), outcome(t, b), "one outcome, shared")
			assert.Equal(t, StateSucceeded, outcome(t, a).State)
			closeD(t, d)
		})
	})
	t.Run("SkipIncoming ends Skipped at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, f, g := held(t, func(p, _ int) (int, error) { return p, SkipIncoming })
			a, b := submit(t, d, "k", 1, SubmitOptions{}), submit(t, d, "k", 2, SubmitOptions{})
			r, done := b.Result()
			require.True(t, done, "the skipped submission ended at once, before anything ran")
			assert.Equal(t, StateSkipped, r.State)
			g.open()
			waitAll(a)
			assert.Equal(t, []int{1}, f.calls("k"))
			closeD(t, d)
		})
	})
	t.Run("a refusal leaves the pending call untouched", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, f, g := held(t, func(int, int) (int, error) { return 0, refuse })
			a := submit(t, d, "k", 1, SubmitOptions{})
			_, err := d.Submit(bg, "k", 2, SubmitOptions{})
			assert.ErrorIs(t, err, ErrMergeRejected)
			g.open()
			waitAll(a)
			assert.Equal(t, []int{1}, f.calls("k"))
			assert.Equal(t, StateSucceeded, outcome(t, a).State)
			closeD(t, d)
		})
	})
	t.Run("one running, one pending, which keeps its place", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			g := f.block("k")
			d := newD(t, f.exec, Config[string, int]{Workers: 1})
			require.NoError(t, d.Post("k", 1, SubmitOptions{}))
			synctest.Wait() // k runs
			require.NoError(t, d.Post("k", 2, SubmitOptions{}))
			require.NoError(t, d.Post("k", 3, SubmitOptions{}))
			time.Sleep(time.Millisecond)
			require.NoError(t, d.Post("other", 0, SubmitOptions{}))
			assert.Equal(t, 1, d.Stats().Successors, "one pending behind the running call")
			f.block("k").open() // the successor does not block
			g.open()
			synctest.Wait()
			assert.Equal(t, []string{"k", "k", "other"}, f.keys(), "the successor ran in its place, before a later key")
			assert.Equal(t, []int{1, 3}, f.calls("k"))
			closeD(t, d)
		})
	})
	t.Run("never across generations or idempotency keys", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var merges atomic.Int64
			d, f, g := held(t, func(_, in int) (int, error) { merges.Add(1); return in, nil })
			a := submit(t, d, "k", 1, SubmitOptions{Generation: 1})
			b := submit(t, d, "k", 2, SubmitOptions{Generation: 2})
			r, done := a.Result()
			require.True(t, done)
			assert.Equal(t, StateStale, r.State, "the older generation's call ended, not merged")
			c := submit(t, d, "i", 1, SubmitOptions{IdempotencyKey: "x"})
			_, err := d.Submit(bg, "i", 2, SubmitOptions{IdempotencyKey: "y"})
			assert.ErrorIs(t, err, ErrMergeRejected)
			assert.Zero(t, merges.Load(), "Merge was never asked")
			g.open()
			waitAll(b, c)
			assert.Equal(t, []int{2}, f.calls("k"))
			assert.Equal(t, []int{1}, f.calls("i"))
			closeD(t, d)
		})
	})
}

// startObserver records each execution's Event as OnStart sees it.
type startObserver struct {
	NopObserver
	mu     sync.Mutex
	starts []Event
}

func (o *startObserver) OnStart(e Event, _ int, _ time.Duration) {
	o.mu.Lock()
	o.starts = append(o.starts, e)
	o.mu.Unlock()
}

func (o *startObserver) all() []Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.starts)
}

// TestReadmePriorityAndAging holds Semantics in brief's "Priority and
// aging" with one worker, held while the calls queue.
func TestReadmePriorityAndAging(t *testing.T) {
	docSays(t, "README.md", "Ready calls run highest priority first, FIFO among equals, exactly for every pair of `int` priorities. Priorities fall into bands of `Config.AgingBand` levels (10 by default), and aging (`Config.Aging`, one level per second by default) works only within a band: a call never runs before a ready call of a higher band, however old it is — a binding at 10 never waits behind status patches at 0, and the patches run whenever no binding is ready")
	docSays(t, "README.md", "`AgingBand: 1` is strict priority. A merged call runs at the highest priority and earliest arrival of its live waiters, in the tenant and under the label of the most urgent.")
	// run queues calls behind a held worker, each after its sleep, and
	// returns the order they ran in.
	type sub struct {
		key   string
		prio  int
		sleep time.Duration // before this submission
	}
	run := func(t *testing.T, cfg Config[string, int], subs ...sub) []string {
		f := newFixture[string, int]()
		g := f.block("hold")
		cfg.Workers = 1
		d := newD(t, f.exec, cfg)
		require.NoError(t, d.Post("hold", math.MaxInt, SubmitOptions{Priority: math.MaxInt}))
		synctest.Wait()
		for _, s := range subs {
			time.Sleep(s.sleep)
			require.NoError(t, d.Post(s.key, 0, prio(s.prio)))
		}
		g.open()
		synctest.Wait()
		closeD(t, d)
		return f.keys()[1:]
	}
	t.Run("every pair of ints, FIFO among equals", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			got := run(t, Config[string, int]{},
				sub{"0", 0, 0}, sub{"min", math.MinInt, 0}, sub{"max", math.MaxInt, 0}, sub{"min+1", math.MinInt + 1, 0},
				sub{"max-1", math.MaxInt - 1, 0}, sub{"-1", -1, 0}, sub{"5a", 5, 0}, sub{"5b", 5, 0}, sub{"max'", math.MaxInt, 0})
			assert.Equal(t, []string{"max", "max'", "max-1", "5a", "5b", "0", "-1", "min+1", "min"}, got)
		})
	})
	t.Run("a binding at 10 never waits behind patches at 0", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			got := run(t, Config[string, int]{}, sub{"patch1", 0, 0}, sub{"patch2", 9, 9*time.Second + time.Millisecond}, sub{"bind", 10, time.Hour})
			assert.Equal(t, []string{"bind", "patch1", "patch2"}, got, "an hour of aging does not lift 0 to 10's band")
		})
	})
	t.Run("aging within a band: one level per second by default", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			got := run(t, Config[string, int]{}, sub{"old", 0, 0}, sub{"new", 3, 3*time.Second + time.Millisecond})
			assert.Equal(t, []string{"old", "new"}, got, "0, 3 s older, is at level 3 before the 3 arrived")
			got = run(t, Config[string, int]{}, sub{"old", 0, 0}, sub{"new", 3, 2 * time.Second})
			assert.Equal(t, []string{"new", "old"}, got)
		})
	})
	t.Run("AgingBand 1 is strict priority", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			got := run(t, Config[string, int]{AgingBand: 1}, sub{"old", 0, 0}, sub{"new", 1, time.Hour})
			assert.Equal(t, []string{"new", "old"}, got)
		})
	})
	t.Run("a merged call: highest priority, earliest arrival, the most urgent's tenant and label", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			g := f.block("hold")
			obs := &startObserver{}
			d := newD(t, f.exec, Config[string, int]{
				Workers: 1, AgingBand: 1, Observer: obs,
				Label: func(_ string, v int) string { return fmt.Sprint("v", v) },
				Merge: func(p, in int) (int, error) { return p + in, nil },
			})
			require.NoError(t, d.Post("hold", 0, SubmitOptions{Priority: 100}))
			synctest.Wait()
			require.NoError(t, d.Post("k", 1, SubmitOptions{Priority: 0, Tenant: "low"}))
			time.Sleep(time.Millisecond)
			require.NoError(t, d.Post("peer", 0, SubmitOptions{Priority: 5, Tenant: "high"}))
			time.Sleep(time.Millisecond)
			require.NoError(t, d.Post("k", 2, SubmitOptions{Priority: 5, Tenant: "high"}))
			g.open()
			synctest.Wait()
			assert.Equal(t, []string{"hold", "k", "peer"}, f.keys(), "k at 5, arrived before peer")
			assert.Equal(t, []int{3}, f.calls("k"))
			assert.Equal(t, Event{Label: "v2", Tenant: "high"}, obs.all()[1])
			closeD(t, d)
		})
	})
}

// TestReadmeWaitersDeadlinesCancellation holds Semantics in brief's
// "Waiters, deadlines, cancellation".
func TestReadmeWaitersDeadlinesCancellation(t *testing.T) {
	docSays(t, "README.md", "`Submit` returns at once with a `Ticket`; its ctx and `SubmitOptions.Deadline` (or `Timeout`, that long after the submission on the dispatcher's own clock, which spares the caller a clock read) scope only that waiter, which ends `StateCanceled` or `StateExpired` on its own. When a call's last waiter leaves, a pending call is removed and a running call's context is cancelled; the execution context carries the latest deadline among live waiters.")
	docSays(t, "README.md", "and it returns refusals only, in both modes. `Cancel(key, cause)` ends everything for a key.")
	t.Run("each waiter leaves on its own; the last takes the pending call", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			g := f.block("hold")
			d := newD(t, f.exec, Config[string, int]{Workers: 1})
			require.NoError(t, d.Post("hold", 0, SubmitOptions{}))
			synctest.Wait()
			start := time.Now()
			ctx, cancel := context.WithCancel(bg)
			a := submit(t, d, "k", 1, SubmitOptions{Timeout: time.Second})
			b := submit(t, d, "k", 1, SubmitOptions{Deadline: start.Add(2 * time.Second)})
			c, err := d.Submit(ctx, "k", 1, SubmitOptions{})
			require.NoError(t, err)
			cancel()
			<-c.Done()
			assert.Equal(t, StateCanceled, outcome(t, c).State)
			<-a.Done()
			assert.Equal(t, StateExpired, outcome(t, a).State)
			assert.Equal(t, time.Second, time.Since(start), "Timeout: that long after the submission")
			assert.Equal(t, 1, d.Stats().Ready, "b still waits for the call")
			<-b.Done()
			assert.Equal(t, StateExpired, outcome(t, b).State)
			assert.Equal(t, 2*time.Second, time.Since(start))
			assert.Zero(t, d.Stats().Ready, "the last waiter took the pending call with it")
			g.open()
			synctest.Wait()
			assert.Empty(t, f.calls("k"), "the removed call never ran")
			closeD(t, d)
		})
	})
	t.Run("the running call: the latest deadline, cancelled when the last waiter leaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			seen := make(chan time.Time, 1)
			ended := make(chan error, 1)
			hold := newGate()
			d := newD(t, func(ctx context.Context, k string, _ int) error {
				if k == "hold" {
					return hold.wait(ctx)
				}
				dl, _ := ctx.Deadline()
				seen <- dl
				<-ctx.Done()
				ended <- ctx.Err()
				return ctx.Err()
			}, Config[string, int]{Workers: 1})
			require.NoError(t, d.Post("hold", 0, SubmitOptions{})) // both waiters join k's call while it is pending
			synctest.Wait()
			start := time.Now()
			ctx, cancel := context.WithCancel(bg)
			a, err := d.Submit(ctx, "k", 1, SubmitOptions{Deadline: start.Add(time.Hour)})
			require.NoError(t, err)
			b := submit(t, d, "k", 1, SubmitOptions{Deadline: start.Add(time.Minute)})
			hold.open()
			assert.Equal(t, start.Add(time.Hour), <-seen, "the latest deadline among live waiters")
			cancel()
			<-a.Done()
			synctest.Wait()
			assert.Empty(t, ended, "b still waits: the call runs on")
			b.Cancel()
			assert.ErrorIs(t, <-ended, context.Canceled, "the last waiter left: the running call's context ended")
			waitAll(b)
			closeD(t, d)
		})
	})
	t.Run("Post returns refusals only, in both modes", func(t *testing.T) {
		for _, mode := range []Mode{ModeAsync, ModeSync} {
			synctest.Test(t, func(t *testing.T) {
				d := newD(t, func(context.Context, string, int) error { return errors.New("the API said no") },
					Config[string, int]{Rollout: RolloutPolicy{Mode: mode}, Retry: RetryPolicy{MaxAttempts: 1}})
				assert.NoError(t, d.Post("k", 1, SubmitOptions{}), "%v: a failed execution is no refusal", mode)
				synctest.Wait()
				assert.EqualValues(t, 1, d.Stats().Calls[StateFailed], "%v", mode)
				closeD(t, d)
				assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{}), ErrClosed, "%v", mode)
			})
		}
	})
	t.Run("Cancel ends everything for a key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			f.block("k")
			d := newD(t, f.exec, Config[string, int]{Workers: 2})
			running := submit(t, d, "k", 1, SubmitOptions{})
			synctest.Wait()
			successor := submit(t, d, "k", 2, SubmitOptions{})
			cause := errors.New("pod deleted")
			assert.True(t, d.Cancel("k", cause))
			waitAll(running, successor)
			for _, tk := range []*Ticket[string, int]{running, successor} {
				r := outcome(t, tk)
				assert.Equal(t, StateCanceled, r.State)
				assert.ErrorIs(t, r.Err, cause)
			}
			synctest.Wait() // the cancelled execution returns
			assert.False(t, d.Busy("k"))
			assert.Equal(t, []int{1}, f.calls("k"), "the successor never ran")
			closeD(t, d)
		})
	})
}

// TestReadmeGenerations holds Semantics in brief's "Generations and
// StateStale".
func TestReadmeGenerations(t *testing.T) {
	docSays(t, "README.md", "`SubmitOptions.Generation` fences old work: a newer generation supersedes older ones for the key, and an older submission is refused with `ErrStale`. An execution that finishes after its call was cancelled, superseded or expired is reported `StateStale` — counted for audit, never delivered as success.")
	for _, leave := range []string{"cancelled", "superseded", "expired"} {
		t.Run(leave, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				var done hookLog[string, int]
				d := newD(t, func(context.Context, string, int) error { return g.wait(bg) }, Config[string, int]{OnDone: done.add})
				start := time.Now()
				ctx, cancel := context.WithCancel(bg)
				defer cancel()
				old, err := d.Submit(ctx, "k", 1, SubmitOptions{Generation: 1, Deadline: start.Add(time.Second)})
				require.NoError(t, err)
				synctest.Wait() // it runs, ignoring its context
				var newer *Ticket[string, int]
				switch leave {
				case "cancelled":
					cancel()
				case "superseded":
					newer = submit(t, d, "k", 2, SubmitOptions{Generation: 2})
					_, err := d.Submit(bg, "k", 3, SubmitOptions{Generation: 1})
					assert.ErrorIs(t, err, ErrStale, "an older submission is refused")
				case "expired":
					time.Sleep(time.Second)
				}
				<-old.Done()
				assert.False(t, outcome(t, old).State.OK())
				g.open()
				synctest.Wait()
				assert.Equal(t, StateStale, done.of("k")[0].State, "the execution that finished after its waiters left")
				assert.EqualValues(t, 1, d.Stats().StaleExecutions)
				if newer != nil {
					waitAll(newer)
					assert.Equal(t, StateSucceeded, outcome(t, newer).State)
				}
				closeD(t, d)
			})
		})
	}
}

// TestReadmeCapacityAndBackpressure holds Semantics in brief's "Capacity
// and backpressure": Capacity 3, one key running and one worker.
func TestReadmeCapacityAndBackpressure(t *testing.T) {
	docSays(t, "README.md", "`Config.Capacity` bounds tracked keys and `Config.MaxWaiters` live tickets")
	docSays(t, "README.md", "A new key beyond the bound evicts the worst queued call marked `Droppable` if the newcomer is better — its waiters get `StateDropped` — and is otherwise refused at once with a `*BackpressureError` naming the `Bound`. Non-droppable work and running calls are never shed.")
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("running")
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Capacity: 3, MaxWaiters: 4})
		running := submit(t, d, "running", 0, SubmitOptions{Droppable: true, Priority: -10})
		synctest.Wait()
		drop := submit(t, d, "drop", 0, SubmitOptions{Droppable: true, Priority: 1})
		keep := submit(t, d, "keep", 0, SubmitOptions{Priority: -5})
		refused := func(key string, o SubmitOptions, bound Bound) {
			t.Helper()
			_, err := d.Submit(bg, key, 0, o)
			var bp *BackpressureError
			require.ErrorAs(t, err, &bp, "%s", key)
			assert.Equal(t, bound, bp.Bound, "%s", key)
			assert.ErrorIs(t, err, ErrBackpressure)
		}
		refused("worse", SubmitOptions{Priority: 1}, BoundCapacity) // not better than the droppable call
		better := submit(t, d, "better", 0, SubmitOptions{Priority: 2})
		r, done := drop.Result()
		require.True(t, done, "the droppable call was shed at once")
		assert.Equal(t, StateDropped, r.State)
		// Left: the running droppable call and non-droppable work.
		refused("best", SubmitOptions{Priority: 100}, BoundCapacity)
		assert.EqualValues(t, 1, d.Stats().Shed[BoundCapacity])
		// MaxWaiters: running, keep and better hold three tickets; a
		// fourth on a tracked key fits, a fifth does not.
		extra := submit(t, d, "keep", 0, SubmitOptions{Priority: -5})
		refused("keep", SubmitOptions{Priority: -5}, BoundWaiters)
		g.open()
		waitAll(running, keep, better, extra)
		for _, tk := range []*Ticket[string, int]{running, keep, better, extra} {
			assert.Equal(t, StateSucceeded, outcome(t, tk).State)
		}
		closeD(t, d)
	})
}

// TestReadmeRetries holds Semantics in brief's "Retries": on by default,
// three attempts, each retry waiting out its backoff in the queue while
// the one worker runs other calls.
func TestReadmeRetries(t *testing.T) {
	docSays(t, "README.md", "On by default (3 attempts, exponential backoff with jitter, a server's `Retry-After` honoured).")
	docSays(t, "README.md", "a retry waits in the queue, never in a worker")
	synctest.Test(t, func(t *testing.T) {
		var attempts atomic.Int64
		f := newFixture[string, int]()
		d := newD(t, func(ctx context.Context, key string, v int) error {
			if key == "flaky" {
				attempts.Add(1)
				return errors.New("503: try again")
			}
			return f.exec(ctx, key, v)
		}, Config[string, int]{Workers: 1, Classify: func(error) Class { return ClassRetry }})
		tk := submit(t, d, "flaky", 0, SubmitOptions{})
		synctest.Wait()
		require.EqualValues(t, 1, attempts.Load())
		assert.Equal(t, 1, d.Stats().Delayed, "the retry waits out its backoff in the queue")
		other := submit(t, d, "other", 0, SubmitOptions{})
		synctest.Wait()
		_, done := other.Result()
		assert.True(t, done, "the one worker was free meanwhile")
		waitAll(tk)
		assert.EqualValues(t, 3, attempts.Load(), "3 attempts by default")
		assert.Equal(t, StateFailed, outcome(t, tk).State)
		closeD(t, d)
	})
}

// TestReadmeLifecycle holds Semantics in brief's "Lifecycle".
func TestReadmeLifecycle(t *testing.T) {
	docSays(t, "README.md", "`New` starts nothing; workers start on first use. `Close(ctx)` refuses new work with `ErrClosed`, runs what is queued by priority until ctx ends, ends the rest `StateClosed`, and returns when every goroutine it started and every execution has returned. It is idempotent.")
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("hold")
		d := newD(t, f.exec, Config[string, int]{Workers: 1})
		assert.Zero(t, dispatcherGoroutines(), "New starts nothing")
		require.NoError(t, d.Post("hold", 0, SubmitOptions{}))
		synctest.Wait()
		assert.NotZero(t, dispatcherGoroutines(), "workers start on first use")
		low := submit(t, d, "low", 0, prio(0))
		high := submit(t, d, "high", 0, prio(50))
		rest := submit(t, d, "rest", 0, prio(-50))
		f.block("low") // holds the drain past Close's context
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(ctx) }()
		synctest.Wait()
		_, err := d.Submit(bg, "new", 0, SubmitOptions{})
		assert.ErrorIs(t, err, ErrClosed)
		g.open()
		synctest.Wait()
		assert.Equal(t, []string{"hold", "high", "low"}, f.keys(), "by priority, until ctx ends")
		assert.Empty(t, closed, "Close waits for the execution")
		time.Sleep(time.Second) // ctx ends; low's execution sees it and returns
		assert.Error(t, <-closed)
		assert.Equal(t, StateClosed, outcome(t, rest).State)
		assert.Equal(t, StateSucceeded, outcome(t, high).State)
		_, done := low.Result()
		assert.True(t, done)
		assert.Zero(t, dispatcherGoroutines(), "every goroutine it started has returned")
		assert.NoError(t, d.Close(bg), "idempotent")
	})
}

// dispatcherGoroutines counts the live goroutines a Dispatcher started
// (a worker, the clock, the notifier): those of other tests, which may
// still be on their way out, are not counted.
func dispatcherGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "created by github.com/coalescer/dispatch.(*Dispatcher[")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestReadmeRetryAfterHold: a Retry-After makes the call that drew it wait
// the full time in every case; the hold it puts on the other calls (at most
// Retry.MaxBackoff, never on a call that may use a reserved worker) is the
// adaptive limit's, so without Config.Start.Adaptive nothing else is held.
func TestReadmeRetryAfterHold(t *testing.T) {
	docSays(t, "README.md", "A `Retry-After` makes the call that got it wait the full time and, with `Adaptive`, holds the other calls for at most `Retry.MaxBackoff` — never the calls that may use reserved workers.")
	for _, adaptive := range []bool{false, true} {
		t.Run(fmt.Sprint("adaptive=", adaptive), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newStartLog()
				var drew atomic.Bool
				var drewAt time.Time
				start := StartPolicy{ReservedWorkers: 1, UrgentPriority: 100}
				if adaptive {
					start.Adaptive = &AdaptivePolicy{}
				}
				d := newD(t, func(ctx context.Context, k string, v int) error {
					_ = log.exec(time.Millisecond)(ctx, k, v)
					if k == "patch" && !drew.Load() {
						drewAt = time.Now()
						drew.Store(true)
						return retryAfterErr{time.Hour}
					}
					return nil
				}, Config[string, int]{Workers: 4, Start: start, Retry: RetryPolicy{MaxBackoff: time.Second}})
				patch := submit(t, d, "patch", 1, prio(0))
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				require.True(t, drew.Load())
				at := time.Now()
				bind := submit(t, d, "bind", 1, prio(100))
				low := submit(t, d, "low", 1, prio(0))
				waitAll(bind, low)
				s, _ := log.startOf("bind")
				assert.Equal(t, at, s, "a call that may use a reserved worker is never held")
				s, _ = log.startOf("low")
				if adaptive {
					assert.Greater(t, s.Sub(at), time.Duration(0), "the hold")
					assert.LessOrEqual(t, s.Sub(at), time.Second, "at most MaxBackoff")
				} else {
					assert.Equal(t, at, s, "no adaptive limit, no hold")
				}
				time.Sleep(time.Until(drewAt.Add(time.Hour - time.Millisecond)))
				_, ended := patch.Result()
				assert.False(t, ended, "the call that drew it waits the full time")
				waitAll(patch)
				assert.Equal(t, StateSucceeded, outcome(t, patch).State)
				closeD(t, d)
			})
		})
	}
}

// TestReadmeSwitchToSync holds Rolling out's account of a switch to
// ModeSync, draining (the default) and with Rollout.CancelQueued: one
// worker runs a held call while two wait behind it.
func TestReadmeSwitchToSync(t *testing.T) {
	docSays(t, "README.md", "`ModeSync` runs each submission inline in its caller")
	docSays(t, "README.md", "Going to `ModeSync` stops async admission at once; what is already queued is drained by the workers (the default; `SetMode` waits until it is done or its ctx ends) or, with `Rollout.CancelQueued`, cancelled: waiters get `StateCanceled` with `ErrFallback`, meaning \"run it synchronously yourself\". Running calls always finish")
	for _, cancelQueued := range []bool{false, true} {
		t.Run(fmt.Sprint("CancelQueued=", cancelQueued), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				g := f.block("running")
				d := newD(t, f.exec, Config[string, int]{Workers: 1, Rollout: RolloutPolicy{CancelQueued: cancelQueued}})
				running := submit(t, d, "running", 0, SubmitOptions{})
				synctest.Wait()
				queued := []*Ticket[string, int]{submit(t, d, "q1", 0, SubmitOptions{}), submit(t, d, "q2", 0, SubmitOptions{})}
				switched := make(chan error, 1)
				go func() { switched <- d.SetMode(bg, ModeSync) }()
				synctest.Wait()
				assert.Equal(t, ModeSync, d.Mode())
				require.NoError(t, d.Post("inline", 0, SubmitOptions{}))
				assert.Equal(t, []int{0}, f.calls("inline"), "run inline, before Post returned, the worker still held")
				if cancelQueued {
					require.NoError(t, <-switched, "nothing to wait for")
					waitAll(queued...)
					for _, tk := range queued {
						r := outcome(t, tk)
						assert.Equal(t, StateCanceled, r.State)
						assert.ErrorIs(t, r.Err, ErrFallback)
					}
				} else {
					assert.Empty(t, switched, "SetMode waits for the drain")
				}
				g.open()
				waitAll(running)
				assert.Equal(t, StateSucceeded, outcome(t, running).State, "the running call finished")
				if !cancelQueued {
					require.NoError(t, <-switched)
					waitAll(queued...) // ended; told on their way out
					for _, tk := range queued {
						assert.Equal(t, StateSucceeded, outcome(t, tk).State, "drained by the workers")
					}
					assert.Equal(t, []string{"running", "inline", "q1", "q2"}, f.keys())
				}
				closeD(t, d)
			})
		})
	}
}

// TestReadmeTokenBeforeChoice: a worker takes its rate-limit token before
// it chooses the call, so the best call when the token comes runs, not the
// one that was best when the worker began to wait.
func TestReadmeTokenBeforeChoice(t *testing.T) {
	docSays(t, "README.md", "A worker takes its rate-limit token before it chooses the call, so the best call at that moment runs.")
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{Workers: 1, RateLimit: rate.NewLimiter(1, 1)})
		require.NoError(t, d.Post("first", 0, prio(0))) // spends the burst
		synctest.Wait()
		require.NoError(t, d.Post("low", 0, prio(0))) // the worker waits for a token
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, d.Post("high", 0, prio(10)))
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"first", "high"}, f.keys(), "the token went to the best call when it came")
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"first", "high", "low"}, f.keys())
		closeD(t, d)
	})
}

// TestReadmeOutcomes: every accepted submission ends in one State, told
// once; OnDone fires once per finished call; and Stats balances
// submitted = rejected + Σ outcomes + live at every step.
func TestReadmeOutcomes(t *testing.T) {
	docSays(t, "README.md", "Every accepted submission ends in exactly one `State`, told once, outside every lock, after the dispatcher's own bookkeeping is final. `Config.OnDone` fires once per finished call (the \"re-evaluate this pod\" event). `Stats()` is a consistent snapshot in which submitted = rejected + Σ outcomes + live always holds.")
	synctest.Test(t, func(t *testing.T) {
		var done hookLog[string, int]
		f := newFixture[string, int]()
		g := f.block("a")
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Capacity: 2, OnDone: done.add})
		balanced := func(when string) {
			t.Helper()
			s := d.Stats()
			assert.Equal(t, s.Submitted, s.Rejected+total(s.Outcomes)+uint64(s.Live), "%s: %+v", when, s)
		}
		tks := []*Ticket[string, int]{submit(t, d, "a", 1, SubmitOptions{})}
		synctest.Wait()
		tks = append(tks, submit(t, d, "b", 1, SubmitOptions{}), submit(t, d, "b", 2, SubmitOptions{}))
		_, err := d.Submit(bg, "c", 1, SubmitOptions{})
		require.ErrorIs(t, err, ErrBackpressure)
		balanced("queued")
		tks[0].Cancel()
		balanced("a waiter left")
		g.open()
		waitAll(tks...)
		synctest.Wait()
		balanced("ended")
		s := d.Stats()
		assert.EqualValues(t, 3, total(s.Outcomes), "one State per accepted submission")
		assert.EqualValues(t, map[State]int{StateCanceled: 1, StateSucceeded: 2}, counts(s.Outcomes))
		assert.Len(t, done.of("a"), 1, "OnDone once per finished call")
		assert.Len(t, done.of("b"), 1, "OnDone once per finished call: b's two submissions made one")
		closeD(t, d)
	})
}

// TestReadmeUserCode: exec that panics, exits its goroutine or calls back
// in, under an OnDone and a Label that panic, in both modes: every
// submission gets its outcome, the key takes its next call, and Close
// returns.
func TestReadmeUserCode(t *testing.T) {
	docSays(t, "README.md", "exec and every callback may panic, exit its goroutine, block or call back in: no outcome is lost, no key wedged, the process lives and `Close` returns once nothing blocks it.")
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var d *Dispatcher[string, int]
				d = newD(t, func(_ context.Context, _ string, v int) error {
					switch v {
					case 1:
						panic("exec panics")
					case 2:
						runtime.Goexit()
					case 3:
						return d.Post("reentry", 0, SubmitOptions{})
					}
					return nil
				}, Config[string, int]{
					Rollout:  RolloutPolicy{Mode: mode},
					Retry:    RetryPolicy{MaxAttempts: 1},
					OnDone:   func(Result[string, int]) { panic("OnDone panics") },
					Label:    func(_ string, v int) string { panic("Label panics") },
					Observer: NopObserver{},
				})
				for v := range 4 {
					// From a goroutine of its own: in ModeSync, exec's Goexit
					// is the caller's to survive.
					res := make(chan Result[string, int], 1)
					go func() {
						tk, err := d.Submit(bg, "k", v, SubmitOptions{})
						if err != nil {
							res <- Result[string, int]{Outcome: Outcome{Err: err}}
							return
						}
						r, _ := tk.Wait(bg)
						res <- r
					}()
					synctest.Wait()
					if mode == ModeSync && v == 2 {
						// exec exited the caller's goroutine, Submit with it:
						// the outcome is still recorded, and the key freed.
						require.Empty(t, res)
						s := d.Stats()
						assert.EqualValues(t, 2, s.Outcomes[StateFailed], "value %d: %+v", v, s)
						assert.Zero(t, s.Live)
						assert.False(t, d.Busy("k"))
						continue
					}
					require.Len(t, res, 1, "value %d: an outcome", v)
					r := <-res
					if v == 1 || v == 2 {
						assert.Equal(t, StateFailed, r.State, "value %d: %v", v, r.Err)
					} else {
						assert.Equal(t, StateSucceeded, r.State, "value %d: %v", v, r.Err)
					}
				}
				assert.NotZero(t, d.Stats().CallbackPanics)
				closeD(t, d)
			})
		})
	}
}

// TestReadmeSyncCallersAreTheConcurrency: in ModeSync the reservation does
// not apply: two low-priority callers run at once where, on the workers,
// only one of the two workers would take them.
func TestReadmeSyncCallersAreTheConcurrency(t *testing.T) {
	docSays(t, "README.md", "In `ModeSync` neither the reserved workers nor the adaptive limit and its hold apply: the callers are the concurrency.")
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				d := newD(t, func(ctx context.Context, _ string, _ int) error { return g.wait(ctx) }, Config[string, int]{
					Workers: 2, Rollout: RolloutPolicy{Mode: mode},
					Start: StartPolicy{ReservedWorkers: 1, UrgentPriority: 10},
				})
				var wg sync.WaitGroup
				for _, k := range []string{"a", "b"} {
					wg.Go(func() { assert.NoError(t, d.Post(k, 0, SubmitOptions{})) })
				}
				synctest.Wait()
				want := map[Mode]int{ModeAsync: 1, ModeSync: 2}[mode]
				assert.Equal(t, want, d.Stats().InFlight)
				g.open()
				wg.Wait()
				closeD(t, d)
			})
		})
	}
}

// TestReadmeMadeUpTenantsForgotten: a tenant Config.Tenants does not list
// is made for a Post that names it and forgotten once its calls have
// ended; a listed one stays.
func TestReadmeMadeUpTenantsForgotten(t *testing.T) {
	docSays(t, "README.md", "(unless it names a tenant that `Config.Tenants` does not list and that has no call: that tenant is made for it and forgotten after, so that made-up names hold no memory)")
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		d := newD(t, func(ctx context.Context, _ string, _ int) error { return g.wait(ctx) },
			Config[string, int]{Tenants: map[string]TenantConfig{"listed": {}}})
		for i := range 100 {
			require.NoError(t, d.Post(fmt.Sprint("k", i), 0, SubmitOptions{Tenant: fmt.Sprint("made-up-", i)}))
		}
		require.NoError(t, d.Post("l", 0, SubmitOptions{Tenant: "listed"}))
		synctest.Wait()
		assert.Contains(t, d.Stats().Tenants, "made-up-7", "made for its call")
		g.open()
		synctest.Wait()
		s := d.Stats()
		assert.Contains(t, s.Tenants, "listed")
		for name := range s.Tenants {
			assert.False(t, strings.HasPrefix(name, "made-up-"), "%s: forgotten once its calls ended", name)
		}
		closeD(t, d)
	})
}
