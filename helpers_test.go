package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Shared helpers for the behavioural tests: every helper used by more than
// one test file lives here.
//
// Every helper that starts or waits for anything is meant to run inside a
// testing/synctest bubble: the Dispatcher must be created there (its clock
// origin is the bubble's fake clock) and closed there.
//
// The tests check the public API only, so that the core's internals can be
// renamed or moved without touching them. The few that must look inside —
// the virtual-time sort key and the ready index (queue_test.go), backoff
// jitter (retry_test.go) and the lane free list (dispatcher_test.go) — say
// "(internal)" after their name in their doc comment; they are the ones to
// adapt when an internal changes.

// bg is the context for submissions that never leave on their own.
var bg = context.Background()

// newD creates a Dispatcher and makes sure it is closed inside the current
// bubble even when the test stops early: t.Cleanup runs in the bubble, before
// synctest waits for the bubble's goroutines. Tests still call closeD (or
// Close) themselves to check what Close returns; Close is idempotent.
func newD[K comparable, T any](t *testing.T, exec ExecFunc[K, T], cfg Config[K, T]) *Dispatcher[K, T] {
	t.Helper()
	d, err := New(exec, cfg)
	require.NoError(t, err)
	require.NotNil(t, d)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(bg, time.Hour)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// closeD closes d, expecting it to drain, and checks that nothing is left
// and that conservation holds.
func closeD[K comparable, T any](t *testing.T, d *Dispatcher[K, T]) Stats {
	t.Helper()
	require.NoError(t, d.Close(bg), "Close should drain everything")
	s := checkConservation(t, d)
	require.Zero(t, s.Live, "live submissions after Close")
	require.Zero(t, s.Tickets, "live tickets after Close")
	require.Zero(t, s.Keys, "tracked keys after Close")
	require.Zero(t, s.Ready, "ready calls after Close")
	require.Zero(t, s.Delayed, "delayed calls after Close")
	require.Zero(t, s.Successors, "successors after Close")
	require.Zero(t, s.InFlight, "in-flight calls after Close")
	return s
}

// conserved reports whether s satisfies the conservation law, and why not.
func conserved(s Stats) error {
	sum := total(s.Outcomes)
	switch {
	case s.Outcomes[0] != 0:
		return fmt.Errorf("%d outcomes with the zero State", s.Outcomes[0])
	case s.Live < 0 || s.Tickets < 0 || s.Keys < 0 || s.Ready < 0 || s.Delayed < 0 || s.Successors < 0 || s.InFlight < 0:
		return fmt.Errorf("negative gauge in %+v", s)
	case s.Tickets > s.Live:
		return fmt.Errorf("Tickets %d > Live %d", s.Tickets, s.Live)
	case s.Submitted != s.Rejected+sum+uint64(s.Live):
		return fmt.Errorf("Submitted %d != Rejected %d + Σ Outcomes %d + Live %d",
			s.Submitted, s.Rejected, sum, s.Live)
	}
	return nil
}

// checkConservation asserts Submitted == Rejected + Σ Outcomes + Live on a
// snapshot of d, and returns the snapshot.
func checkConservation[K comparable, T any](t testing.TB, d *Dispatcher[K, T]) Stats {
	t.Helper()
	s := d.Stats()
	require.NoError(t, conserved(s), "conservation: %+v", s)
	return s
}

// counts returns the non-zero counters of c (Stats.Outcomes or Stats.Calls)
// by state.
func counts(c map[State]uint64) map[State]int {
	m := map[State]int{}
	for st, n := range c {
		if n != 0 {
			m[st] = int(n)
		}
	}
	return m
}

// total sums c (Stats.Outcomes or Stats.Calls).
func total(c map[State]uint64) uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

// sentinel is the error every non-OK state's Err must match.
var sentinel = map[State]error{
	StateCanceled: ErrCanceled,
	StateExpired:  ErrExpired,
	StateDropped:  ErrDropped,
	StateStale:    ErrStale,
	StateClosed:   ErrClosed,
}

// checkStateErr asserts that err agrees with st.
func checkStateErr(t testing.TB, st State, err error) {
	t.Helper()
	require.GreaterOrEqual(t, st, StateSucceeded, "not a terminal state: %v", st)
	require.LessOrEqual(t, st, StateClosed, "not a terminal state: %v", st)
	switch {
	case st.OK():
		require.NoError(t, err, "state %v", st)
	case st == StateFailed:
		require.Error(t, err, "Failed without an error")
	default:
		require.ErrorIs(t, err, sentinel[st], "state %v", st)
	}
}

// outcome asserts that tk has its one outcome and that it is final: Done is
// closed, Result and Wait (even with a done context) agree and keep
// agreeing, the error matches the state, and a late Cancel changes nothing.
// (A second close of Done would panic the test binary, so a closed Done that
// stays closed with a stable result is "told exactly once".)
func outcome[K comparable, T any](t testing.TB, tk *Ticket[K, T]) Result[K, T] {
	t.Helper()
	require.NotNil(t, tk)
	select {
	case <-tk.Done():
	default:
		require.FailNow(t, "ticket has no outcome yet")
	}
	r, ok := tk.Result()
	require.True(t, ok, "Result() not ok after Done")
	checkStateErr(t, r.State, r.Err)

	done, cancel := context.WithCancel(bg)
	cancel()
	rw, err := tk.Wait(done)
	require.Equal(t, r, rw, "Wait disagrees with Result")
	require.Equal(t, r.Err, err, "Wait's error is not Result.Err")

	tk.Cancel() // after the outcome: must change nothing
	r2, ok := tk.Result()
	require.True(t, ok)
	require.Equal(t, r, r2, "outcome changed after it was delivered")
	return r
}

// tally asserts that every ticket has exactly one outcome (see outcome) and
// counts them by state.
func tally[K comparable, T any](t testing.TB, tickets ...*Ticket[K, T]) map[State]int {
	t.Helper()
	m := map[State]int{}
	seen := map[*Ticket[K, T]]bool{}
	for _, tk := range tickets {
		require.False(t, seen[tk], "ticket listed twice")
		seen[tk] = true
		m[outcome(t, tk).State]++
	}
	return m
}

// waitAll blocks until every ticket has its outcome.
func waitAll[K comparable, T any](tickets ...*Ticket[K, T]) {
	for _, tk := range tickets {
		<-tk.Done()
	}
}

// submit submits with the background context and requires success.
func submit[K comparable, T any](t testing.TB, d *Dispatcher[K, T], key K, call T, o SubmitOptions) *Ticket[K, T] {
	t.Helper()
	tk, err := d.Submit(bg, key, call, o)
	require.NoError(t, err, "Submit(%v, %v, %+v)", key, call, o)
	require.NotNil(t, tk)
	return tk
}

// prio is shorthand for SubmitOptions{Priority: p}.
func prio(p int) SubmitOptions { return SubmitOptions{Priority: p} }

// gate blocks executions until it is opened.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// wait blocks until the gate opens (nil) or ctx ends (its cause).
func (g *gate) wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// holdOne is an exec that records the values it runs, in order, and
// holds the execution of value 1 until its gate opens.
type holdOne struct {
	gate *gate
	mu   sync.Mutex
	ran  []int
}

func newHoldOne() *holdOne { return &holdOne{gate: newGate()} }

func (h *holdOne) exec(ctx context.Context, _ string, v int) error {
	h.mu.Lock()
	h.ran = append(h.ran, v)
	h.mu.Unlock()
	if v == 1 {
		return h.gate.wait(ctx)
	}
	return nil
}

// values returns the values run so far, in order.
func (h *holdOne) values() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ran)
}

// holdKey is the key of the call that holdWorker keeps in flight.
const holdKey = "hold"

// holdWorker is the opening of most ordering and coalescing tests: it
// creates a Dispatcher with cfg and a single worker, and keeps that worker
// busy with a call to holdKey until release is called. Everything the test
// submits meanwhile queues up behind the held call — a submission for a key
// already in flight would become its successor instead — so the test can
// gather submissions into one pending call and knows the order in which they
// will run.
//
// The held call is an ordinary submission (one key, one ticket, and once
// released one Succeeded outcome and one completion), except that it never
// reaches exec and cfg.NoOp is never asked about holdKey. Later submissions
// for holdKey are its successors and run through exec like any call.
//
// release opens the gate, waits for the bubble to settle (synctest.Wait),
// and checks that the held call succeeded; the queue has then run as far as
// it can. cfg.Workers must be 0 or 1. Call holdWorker inside a synctest
// bubble.
func holdWorker[T any](t *testing.T, exec ExecFunc[string, T], cfg Config[string, T]) (d *Dispatcher[string, T], hold *Ticket[string, T], release func()) {
	t.Helper()
	require.LessOrEqual(t, cfg.Workers, 1, "holdWorker holds the only worker")
	cfg.Workers = 1
	if noop := cfg.NoOp; noop != nil {
		cfg.NoOp = func(key string, call T) bool { return key != holdKey && noop(key, call) }
	}
	g := newGate()
	var started atomic.Bool
	d = newD(t, func(ctx context.Context, key string, call T) error {
		if key == holdKey && started.CompareAndSwap(false, true) {
			return g.wait(ctx)
		}
		return exec(ctx, key, call)
	}, cfg)
	var zero T
	hold = submit(t, d, holdKey, zero, SubmitOptions{})
	synctest.Wait()
	require.True(t, started.Load(), "the held call did not start")
	return d, hold, func() {
		t.Helper()
		g.open()
		synctest.Wait()
		require.Equal(t, StateSucceeded, outcome(t, hold).State, "the held call")
	}
}

// nopExec is an exec that succeeds at once.
func nopExec(context.Context, string, int) error { return nil }

// failFirst is an exec whose first execution waits for g and then fails
// with err; every later one succeeds at once. n counts the executions.
type failFirst struct {
	g   *gate
	err error
	n   atomic.Int32
}

func newFailFirst(g *gate, err error) *failFirst { return &failFirst{g: g, err: err} }

func (f *failFirst) exec(ctx context.Context, _ string, _ int) error {
	if f.n.Add(1) == 1 {
		_ = f.g.wait(ctx)
		return f.err
	}
	return nil
}

// execRun is one recorded execution.
type execRun[K comparable, T any] struct {
	Key  K
	Call T
	At   time.Time
}

// fixture is a recording exec: it logs every execution in start order, and
// an execution of a key with a gate blocks until the gate opens or the
// execution's context ends (then it returns the context's cause).
type fixture[K comparable, T any] struct {
	mu    sync.Mutex
	runs  []execRun[K, T]
	gates map[K]*gate
}

func newFixture[K comparable, T any]() *fixture[K, T] {
	return &fixture[K, T]{gates: map[K]*gate{}}
}

// block makes executions of key wait for the returned gate.
func (f *fixture[K, T]) block(key K) *gate {
	g := newGate()
	f.mu.Lock()
	f.gates[key] = g
	f.mu.Unlock()
	return g
}

func (f *fixture[K, T]) exec(ctx context.Context, key K, call T) error {
	f.mu.Lock()
	f.runs = append(f.runs, execRun[K, T]{key, call, time.Now()})
	g := f.gates[key]
	f.mu.Unlock()
	if g != nil {
		return g.wait(ctx)
	}
	return nil
}

// keys returns the executed keys in start order.
func (f *fixture[K, T]) keys() []K {
	f.mu.Lock()
	defer f.mu.Unlock()
	ks := make([]K, len(f.runs))
	for i, r := range f.runs {
		ks[i] = r.Key
	}
	return ks
}

// calls returns the executed call values of key, in start order.
func (f *fixture[K, T]) calls(key K) []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	var vs []T
	for _, r := range f.runs {
		if r.Key == key {
			vs = append(vs, r.Call)
		}
	}
	return vs
}

// startOf returns when the first execution of key started.
func (f *fixture[K, T]) startOf(key K) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.runs {
		if r.Key == key {
			return r.At
		}
	}
	return time.Time{}
}

// hookLog records what the completion hook sees.
type hookLog[K comparable, T any] struct {
	mu  sync.Mutex
	res []Result[K, T]
}

func (h *hookLog[K, T]) add(r Result[K, T]) {
	h.mu.Lock()
	h.res = append(h.res, r)
	h.mu.Unlock()
}

func (h *hookLog[K, T]) all() []Result[K, T] {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Result[K, T](nil), h.res...)
}

// of returns the hook results for key.
func (h *hookLog[K, T]) of(key K) []Result[K, T] {
	var rs []Result[K, T]
	for _, r := range h.all() {
		if r.Key == key {
			rs = append(rs, r)
		}
	}
	return rs
}

// states returns the hook states seen for key.
func (h *hookLog[K, T]) states(key K) []State {
	var ss []State
	for _, r := range h.of(key) {
		ss = append(ss, r.State)
	}
	return ss
}

// doneTimes watches tickets and records, per ticket, the (bubble) time its
// Done channel closed, as an offset from start.
type doneTimes[K comparable, T any] struct {
	mu    sync.Mutex
	start time.Time
	at    map[*Ticket[K, T]]time.Duration
}

func watchDone[K comparable, T any](tickets ...*Ticket[K, T]) *doneTimes[K, T] {
	w := &doneTimes[K, T]{start: time.Now(), at: map[*Ticket[K, T]]time.Duration{}}
	for _, tk := range tickets {
		go func() {
			<-tk.Done()
			w.mu.Lock()
			w.at[tk] = time.Since(w.start)
			w.mu.Unlock()
		}()
	}
	return w
}

func (w *doneTimes[K, T]) of(tk *Ticket[K, T]) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.at[tk]
	return at, ok
}

// errUser is an error a test's user code returns.
var errUser = errors.New("user error")

// errConflict stands for a 409 Conflict, which conflictClassifier judges
// Recompute: rebuild the call from fresh state, not retry it as it is.
var errConflict = errors.New("409 conflict")

// conflictClassifier is DefaultClassifier, except that errConflict is
// Recompute.
func conflictClassifier(err error) Class {
	if errors.Is(err, errConflict) {
		return ClassRecompute
	}
	return DefaultClassifier(err)
}

// noJitter retries up to attempts executions, 100ms apart and then doubling,
// with no jitter and no retry budget: a retry schedule a test can predict.
func noJitter(attempts int) RetryPolicy {
	return RetryPolicy{MaxAttempts: attempts, InitialBackoff: 100 * time.Millisecond, Jitter: JitterNone, BudgetRatio: math.Inf(1)}
}

func itoa(i int) string { return strconv.Itoa(i) }

// strictIf is the Config.AgingBand of strict priority if strict, else of
// the default.
func strictIf(strict bool) int {
	if strict {
		return 1
	}
	return 0
}

// reflectType is T's reflect.Type.
func reflectType[T any]() reflect.Type { return reflect.TypeFor[T]() }

// numericFields lists the int, float and duration fields of struct type
// t, recursing into nested structs and pointers to structs, as dotted
// paths; maps of structs are listed as their element type under
// DefaultTenant's name when that is their element (tenant settings).
func numericFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			out = append(out, numericFields(ft, prefix+f.Name+".")...)
		case ft.Kind() == reflect.Int, ft.Kind() == reflect.Int64, ft.Kind() == reflect.Float64:
			out = append(out, prefix+f.Name)
		}
	}
	return out
}
