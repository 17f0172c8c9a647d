package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// One test per documented claim that a review found the code once
// contradicted. Each begins by finding the sentence it holds to in the
// live doc comment (docSays), so a claim reworded or dropped from the docs
// fails its test instead of leaving it to test a promise no longer made.

// TestLabelOncePerSubmission: Submit and Post, in both modes, run Label
// once each — a Sync-mode Post too, though it goes through Submit's path.
func TestLabelOncePerSubmission(t *testing.T) {
	docSays(t, "Config.Label", "it runs once per submission")
	for _, mode := range []Mode{ModeAsync, ModeSync} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var labels atomic.Int64
				d := newD(t, nopExec, Config[string, int]{
					Label:   func(string, int) string { labels.Add(1); return "x" },
					Rollout: RolloutPolicy{Mode: mode},
				})
				require.NoError(t, d.Post("a", 1, SubmitOptions{}))
				synctest.Wait()
				assert.EqualValues(t, 1, labels.Load(), "one Post")
				waitAll(submit(t, d, "b", 1, SubmitOptions{}))
				assert.EqualValues(t, 2, labels.Load(), "and one Submit")
				closeD(t, d)
			})
		})
	}
}

// TestMaxWaitersCountsSyncPosts: a Sync-mode Post holds a waiter while it
// runs, so with MaxWaiters 1 a second one is refused, and accepted again
// once the first returns.
func TestMaxWaitersCountsSyncPosts(t *testing.T) {
	docSays(t, "Config.MaxWaiters", "bounds live tickets, counting Sync-mode Posts while they run")
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		exec := func(_ context.Context, key string, _ int) error {
			if key == "slow" {
				<-gate
			}
			return nil
		}
		d := newD(t, exec, Config[string, int]{MaxWaiters: 1, Rollout: RolloutPolicy{Mode: ModeSync}})
		first := make(chan error, 1)
		go func() { first <- d.Post("slow", 1, SubmitOptions{}) }()
		synctest.Wait()
		assert.ErrorIs(t, d.Post("other", 1, SubmitOptions{}), ErrBackpressure, "the running Sync-mode Post is a waiter")
		close(gate)
		require.NoError(t, <-first)
		assert.NoError(t, d.Post("other", 1, SubmitOptions{}), "its waiter left when it returned")
		closeD(t, d)
	})
}

// TestClockEventsOnNotifier: an observer stuck in the OnFinish of an
// expired call does not hold up the next deadline.
func TestClockEventsOnNotifier(t *testing.T) {
	docSays(t, "Observer", "or on the notifier goroutine for those of the clock (a deadline, a fallback)")
	docSays(t, "", "A blocked callback that runs outside the lock holds up only its own goroutine: the clock that drives deadlines and backoffs runs no user code.")
	synctest.Test(t, func(t *testing.T) {
		obs := &blockingObserver{gate: make(chan struct{}), in: make(chan struct{})}
		block := make(chan struct{})
		exec := func(ctx context.Context, _ string, _ int) error {
			select {
			case <-block:
			case <-ctx.Done():
			}
			return ctx.Err()
		}
		d := newD(t, exec, Config[string, int]{Workers: 1, Observer: obs})
		start := time.Now()
		require.NoError(t, d.Post("running", 1, SubmitOptions{})) // occupies the one worker
		synctest.Wait()
		first := submit(t, d, "a", 1, SubmitOptions{Deadline: start.Add(time.Second)})
		second := submit(t, d, "b", 1, SubmitOptions{Deadline: start.Add(2 * time.Second)})
		<-first.Done()
		<-obs.in // the clock's OnFinish of "a" is stuck
		assert.Equal(t, StateExpired, outcome(t, first).State)
		<-second.Done()
		assert.Equal(t, StateExpired, outcome(t, second).State)
		assert.Equal(t, 2*time.Second, time.Since(start), "the next deadline fired on time, while the observer was stuck")
		close(obs.gate)
		close(block)
		closeD(t, d)
	})
}

// TestOneClockGoroutine: a thousand tickets with distinct deadlines and a
// thousand calls in backoff add no goroutine.
func TestOneClockGoroutine(t *testing.T) {
	docSays(t, "README.md", "One clock goroutine serves deadlines, backoffs and token waits: the submit path starts no goroutine, timer or context per call.")
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		exec := func(_ context.Context, key string, _ int) error {
			if key == "block" {
				<-gate
				return nil
			}
			return errors.New("try again")
		}
		d := newD(t, exec, Config[string, int]{
			Workers:  2,
			Classify: func(error) Class { return ClassRetry },
			Retry:    RetryPolicy{InitialBackoff: time.Hour, MaxAttempts: 2, BudgetRatio: math.Inf(1), Jitter: JitterNone},
		})
		require.NoError(t, d.Post("warm", 1, SubmitOptions{})) // workers and clock started
		synctest.Wait()
		before := runtime.NumGoroutine()
		require.NoError(t, d.Post("block", 1, SubmitOptions{})) // holds a worker; the other retries
		var tks []*Ticket[string, int]
		for i := range 1000 {
			tks = append(tks, submit(t, d, fmt.Sprint("t", i), 1, SubmitOptions{Deadline: time.Now().Add(2*time.Hour + time.Duration(i)*time.Minute)}))
		}
		synctest.Wait()
		st := d.Stats()
		assert.Equal(t, 1001, st.Delayed, "every call (and warm) failed once and waits out its backoff: %+v", st)
		assert.LessOrEqual(t, runtime.NumGoroutine(), before, "deadlines and backoffs started no goroutine")
		close(gate)
		for _, tk := range tks {
			<-tk.Done()
		}
		closeD(t, d)
	})
}

// TestErrorsMatchSentinels: a refusal's error matches a sentinel, a
// refusal for a done context matches the context's error too, a Failed
// outcome's error is the call's own, and New's and SetMode's argument
// errors name the argument and match no sentinel.
func TestErrorsMatchSentinels(t *testing.T) {
	docSays(t, "ErrBackpressure", "A refusal, and every outcome's error but a Failed one, matches one with [errors.Is] (a refusal for a done context also matches the context's error). New's and SetMode's errors for bad arguments match none.")
	docSays(t, "Config", "New reports a field out of range by name")
	sentinels := []error{ErrBackpressure, ErrClosed, ErrDropped, ErrExpired, ErrCanceled, ErrStale,
		ErrCircuitOpen, ErrMergeRejected, ErrFallback, ErrAttemptEnded}
	matchesNone := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		for _, s := range sentinels {
			assert.NotErrorIs(t, err, s)
		}
	}
	_, err := New(nopExec, Config[string, int]{Workers: -1})
	matchesNone(t, err)
	assert.ErrorContains(t, err, "Workers")

	synctest.Test(t, func(t *testing.T) {
		apiErr := errors.New("the API said no")
		d := newD(t, func(context.Context, string, int) error { return apiErr }, Config[string, int]{})
		err := d.SetMode(t.Context(), Mode(7))
		matchesNone(t, err)
		assert.ErrorContains(t, err, "SetMode(7)")

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = d.Submit(ctx, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrCanceled)
		assert.ErrorIs(t, err, context.Canceled)
		cause := errors.New("shutting down")
		cctx, ccancel := context.WithCancelCause(t.Context())
		ccancel(cause)
		_, err = d.Submit(cctx, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrCanceled)
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, err, cause)
		dctx, dcancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer dcancel()
		_, err = d.Submit(dctx, "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrExpired)
		assert.ErrorIs(t, err, context.DeadlineExceeded)

		tk := submit(t, d, "k", 1, SubmitOptions{})
		waitAll(tk)
		r := outcome(t, tk)
		assert.Equal(t, StateFailed, r.State)
		assert.ErrorIs(t, r.Err, apiErr, "a Failed outcome's error is the call's own")
		closeD(t, d)
		_, err = d.Submit(t.Context(), "k", 1, SubmitOptions{})
		assert.ErrorIs(t, err, ErrClosed)
	})
}

// TestEventTenantAsGiven: the observer sees a submission's tenant as
// given, declared or not, so a free-form tenant is the caller's to avoid.
func TestEventTenantAsGiven(t *testing.T) {
	docSays(t, "Event", "Event names an observation's call by label and tenant, as given: as metric labels, both must come from small fixed sets.")
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var seen []Event
		obs := &funcObserver{finish: func(e Event, _ Outcome) { mu.Lock(); seen = append(seen, e); mu.Unlock() }}
		d := newD(t, nopExec, Config[string, int]{Observer: obs, Tenants: map[string]TenantConfig{"declared": {}}})
		waitAll(submit(t, d, "a", 1, SubmitOptions{Tenant: "declared"}),
			submit(t, d, "b", 1, SubmitOptions{Tenant: "pod-7f3c"}))
		closeD(t, d)
		mu.Lock()
		defer mu.Unlock()
		assert.ElementsMatch(t, []Event{{Tenant: "declared"}, {Tenant: "pod-7f3c"}}, seen)
	})
}

// funcObserver calls finish from OnFinish.
type funcObserver struct {
	NopObserver
	finish func(Event, Outcome)
}

func (o *funcObserver) OnFinish(e Event, out Outcome) { o.finish(e, out) }

// TestLimiterChecks: New refuses a limiter that is not a rate or can grant
// nothing, and only those: a nil *rate.Limiter is no limit, and a paused
// limiter (rate 0, with a burst) or an unlimited one of burst 0 is
// accepted, since it can grant tokens (now, or once SetLimit resumes it).
func TestLimiterChecks(t *testing.T) {
	docSays(t, "Config.RateLimit", "New refuses a NaN or negative limit, and a *rate.Limiter of burst 0 with a finite limit; a nil *rate.Limiter means no limit.")
	var unset *rate.Limiter
	for _, c := range []struct {
		name string
		l    RateLimiter
		ok   bool
	}{
		{"nil pointer", unset, true},
		{"paused", rate.NewLimiter(0, 1), true},
		{"unlimited, burst 0", rate.NewLimiter(rate.Inf, 0), true},
		{"NaN", rate.NewLimiter(rate.Limit(math.NaN()), 1), false},
		{"negative", rate.NewLimiter(-1, 1), false},
		{"burst 0", rate.NewLimiter(10, 0), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := New(nopExec, Config[string, int]{RateLimit: c.l})
			if !c.ok {
				assert.ErrorContains(t, err, "RateLimit")
				return
			}
			require.NoError(t, err)
			require.NoError(t, d.Close(t.Context()))
		})
	}
}

// TestLaneSizeDoc: the memory maxFreeLanes caps is stated with a lane's
// size, which changes whenever a lane's fields do.
func TestLaneSizeDoc(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the figure is a 64-bit platform's")
	}
	size := unsafe.Sizeof(lane[string, int]{})
	docSays(t, "maxFreeLanes", fmt.Sprintf("a lane is %d bytes with string keys and int values", size))
	docSays(t, "maxFreeLanes", fmt.Sprintf("keeps up to %d lanes: about %.1f MB", maxFreeLanes, float64(maxFreeLanes*size)/1e6))
	docSays(t, "callRare", fmt.Sprintf("holds one word for it (%d bytes", unsafe.Sizeof(callRare[string, int]{})))
}

// TestExecutionSizeDoc keeps execution's figures true: its size, and the
// allocation the runtime makes for it, by the runtime's own accounting.
func TestExecutionSizeDoc(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the figure is a 64-bit platform's")
	}
	// The least of three measurements: an allocation elsewhere in the
	// process (the runtime's, the test framework's) can only add to one.
	const n = 10_000
	class := ^uint64(0)
	for range 3 {
		keep := make([]*execution, n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range keep {
			keep[i] = new(execution)
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(keep)
		class = min(class, (after.TotalAlloc-before.TotalAlloc)/n) // a few bytes of the runtime's own round away
	}
	docSays(t, "execution", fmt.Sprintf("%d bytes on a 64-bit platform, one allocation of %d", unsafe.Sizeof(execution{}), class))
}

// TestDocSaysFindsGoneSentences: docSays fails for a sentence the docs do
// not contain, and for a name they do not declare.
func TestDocSaysFindsGoneSentences(t *testing.T) {
	text, err := liveDoc("Config.Label")
	require.NoError(t, err)
	assert.Contains(t, text, "runs once per submission")
	assert.NotContains(t, text, "the dispatcher does not bound them")
	_, err = liveDoc("Config.NoSuchField")
	assert.Error(t, err)
	_, err = liveDoc("NoSuchName")
	assert.Error(t, err)
}

// docSays fails t unless the live documentation of name contains sentence
// (both compared with runs of white space as one space). name is "" for
// the package doc, a declared name ("Observer", "ErrClosed", "New",
// "maxFreeLanes"), a method or field ("Config.Label",
// "Dispatcher.Submit"), or a Markdown file of the module ("README.md").
func docSays(t *testing.T, name, sentence string) {
	t.Helper()
	text, err := liveDoc(name)
	require.NoError(t, err)
	if !strings.Contains(text, squash(sentence)) {
		t.Fatalf("the doc of %q no longer says %q; it says:\n%s", cmp.Or(name, "package dispatch"), sentence, text)
	}
}

// squash turns every run of white space into one space.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// livePackage is the package's documentation as go/doc reads it from the
// non-test sources in this directory, unexported declarations included.
var livePackage = sync.OnceValues(func() (*doc.Package, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return doc.NewFromFiles(fset, files, "github.com/coalescer/dispatch", doc.AllDecls)
})

// liveDoc returns the documentation of name (see docSays), squashed.
func liveDoc(name string) (string, error) {
	if strings.HasSuffix(name, ".md") {
		b, err := os.ReadFile(name)
		return squash(string(b)), err
	}
	p, err := livePackage()
	if err != nil {
		return "", err
	}
	if name == "" {
		return squash(p.Doc), nil
	}
	outer, inner, member := strings.Cut(name, ".")
	for _, typ := range p.Types {
		if typ.Name == outer && member {
			return memberDoc(typ, inner)
		}
		if typ.Name == outer {
			return squash(typ.Doc), nil
		}
	}
	funcs, values := p.Funcs, append(p.Consts, p.Vars...)
	for _, typ := range p.Types {
		funcs = append(funcs, typ.Funcs...)
		values = append(append(values, typ.Consts...), typ.Vars...)
	}
	for _, f := range funcs {
		if f.Name == name {
			return squash(f.Doc), nil
		}
	}
	for _, v := range values {
		for _, spec := range v.Decl.Specs {
			vs := spec.(*ast.ValueSpec)
			for _, id := range vs.Names {
				if id.Name == name {
					return squash(v.Doc + " " + vs.Doc.Text() + " " + vs.Comment.Text()), nil
				}
			}
		}
	}
	return "", fmt.Errorf("package dispatch declares no %q", name)
}

// memberDoc returns the doc of typ's method or field name.
func memberDoc(typ *doc.Type, name string) (string, error) {
	for _, m := range typ.Methods {
		if m.Name == name {
			return squash(m.Doc), nil
		}
	}
	var fields *ast.FieldList
	switch t := typ.Decl.Specs[0].(*ast.TypeSpec).Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	}
	if fields != nil {
		for _, f := range fields.List {
			for _, id := range f.Names {
				if id.Name == name {
					return squash(f.Doc.Text() + " " + f.Comment.Text()), nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s has no method or field %q", typ.Name, name)
}

// TestOnStartExitsDoc keeps the number of Observer.OnStart's exits in a row
// that the docs state true to maxStartExits (TestOnStartAlwaysExiting).
func TestOnStartExitsDoc(t *testing.T) {
	n := map[int]string{2: "two", 3: "three", 4: "four", 5: "five"}[maxStartExits]
	require.NotEmpty(t, n, "maxStartExits %d has no word here", maxStartExits)
	docSays(t, "Observer.OnStart", "after "+n+" such exits in a row, the attempt begins without OnStart")
	docSays(t, "", "sends its call back to the queue untouched, "+n+" times in a row at most before one attempt")
}

// TestBelowReserveDoc: Stats.BelowReserve counts the non-urgent worker
// executions running, as its doc says (and the prometheus module's
// gauge), not the executions non-urgent calls are allowed: at rest it is
// 0, though three of the four workers may run them.
func TestBelowReserveDoc(t *testing.T) {
	docSays(t, "Stats.BelowReserve", "BelowReserve counts the worker executions running below the reservation's priority")
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers: 4,
			Start:   StartPolicy{ReservedWorkers: 1, UrgentPriority: 10},
		})
		<-submit(t, d, "low", 0, SubmitOptions{}).Done()
		s := d.Stats()
		assert.Equal(t, 4, s.Concurrency)
		assert.Equal(t, 1, s.Reserved)
		assert.Zero(t, s.BelowReserve)
		closeD(t, d)
	})
}

// TestAgingAcrossTenants: a priority-1 call of another tenant arriving
// 1.5 Aging intervals after a priority-0 call shares its level, and runs
// first if its tenant's turn comes first; one arriving over 2 intervals
// after it runs after it. AgingBand's "p runs before any q > p arriving
// over (q−p) × Aging after it" held only among one tenant's calls, and
// the doc now says so.
func TestAgingAcrossTenants(t *testing.T) {
	docSays(t, "Config.AgingBand", "across tenants, read (q−p+1) × Aging where this says (q−p) × Aging")
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("a/first")
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Aging: time.Second})
		require.NoError(t, d.Post("a/first", 0, SubmitOptions{Tenant: "a"})) // a's turn is taken
		synctest.Wait()
		require.NoError(t, d.Post("a/low", 0, SubmitOptions{Tenant: "a"}))
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, d.Post("b/tie", 0, SubmitOptions{Tenant: "b", Priority: 1}))
		time.Sleep(time.Second)
		require.NoError(t, d.Post("b/late", 0, SubmitOptions{Tenant: "b", Priority: 1}))
		g.open()
		synctest.Wait()
		assert.Equal(t, []string{"a/first", "b/tie", "a/low", "b/late"}, f.keys())
		closeD(t, d)
	})
}
