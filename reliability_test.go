package dispatch

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests for promises the dispatcher once broke, one per
// promise. Each names the promise; each failed before its fix.

// TestNoStrandedCallAfterSyncSwitch: a tenant-capped call queued before a
// switch to Sync runs once an inline execution of the same tenant frees
// the cap — a worker that found the tenant capped and went idle is woken —
// so SetMode's drain finishes.
func TestNoStrandedCallAfterSyncSwitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		gA, gC := f.block("a"), f.block("c")
		d := newD(t, f.exec, Config[string, int]{
			Workers: 2,
			Tenants: map[string]TenantConfig{"t": {MaxInFlight: 1}},
		})
		on := SubmitOptions{Tenant: "t"}
		a := submit(t, d, "a", 1, on)
		b := submit(t, d, "b", 1, on) // ready, but "t" is at its cap
		synctest.Wait()
		switched := make(chan error, 1)
		go func() { switched <- d.SetMode(context.Background(), ModeSync) }()
		synctest.Wait()
		inline := make(chan *Ticket[string, int], 1)
		go func() {
			tk, err := d.Submit(context.Background(), "c", 1, on) // runs inline, caps ignored
			assert.NoError(t, err)
			inline <- tk
		}()
		synctest.Wait()
		gA.open() // a's worker finds "t" at its cap (c runs inline) and idles
		synctest.Wait()
		gC.open() // c ends: nothing but the fix wakes a worker for b
		synctest.Wait()
		require.NoError(t, <-switched, "SetMode's drain finished")
		c := <-inline
		assert.Equal(t, map[State]int{StateSucceeded: 3}, tally(t, a, b, c))
		closeD(t, d)
	})
}

// TestLargePrioritiesDoNotTie is in queue_test.go.

// TestObserverPanicOnSubmitLosesNothing: Submit and Post tell the outcomes
// they settled (a droppable call evicted for capacity, an older generation
// superseded) before they call the observer, and an observer panic is
// contained: those tickets hear, and their hook fires.
func TestObserverPanicOnSubmitLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("hold")
		hooks := &hookLog[string, int]{}
		obs := &panicky{on: "submit"}
		d := newD(t, f.exec, Config[string, int]{Workers: 1, Capacity: 3, OnDone: hooks.add, Observer: obs})
		hold := submit(t, d, "hold", 1, prio(0))
		synctest.Wait()
		victim := submit(t, d, "victim", 1, SubmitOptions{Droppable: true})
		old := submit(t, d, "gen", 1, SubmitOptions{Generation: 1})
		newcomer := submit(t, d, "newcomer", 1, prio(5))                   // full: evicts victim; OnSubmit panics
		require.NoError(t, d.Post("gen", 2, SubmitOptions{Generation: 2})) // supersedes old; OnSubmit panics
		assert.Equal(t, StateDropped, outcome(t, victim).State)
		assert.Equal(t, StateStale, outcome(t, old).State)
		assert.Equal(t, []State{StateDropped}, hooks.states("victim"))
		g.open()
		waitAll(hold, newcomer)
		s := closeD(t, d)
		assert.GreaterOrEqual(t, s.CallbackPanics, uint64(4))
		require.NotNil(t, s.LastCallbackPanic)
		assert.Equal(t, callbackObserver, s.LastCallbackPanic.Callback)
	})
}

// panicky is an observer that panics in the methods named by on.
type panicky struct {
	NopObserver
	on string
}

func (p *panicky) OnSubmit(Event, bool) {
	if p.on == "submit" {
		panic("observer: submit")
	}
}

func (p *panicky) OnStart(Event, int, time.Duration) {
	if p.on == "start" {
		panic("observer: start")
	}
}

func (p *panicky) OnFinish(Event, Outcome) {
	if p.on == "finish" {
		panic("observer: finish")
	}
}

// TestObserverPanicInSyncDoesNotWedge: an OnStart panic during an inline
// execution is contained; the call runs and the key is released.
func TestObserverPanicInSyncDoesNotWedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{Rollout: RolloutPolicy{Mode: ModeSync}, Observer: &panicky{on: "start"}})
		tk := submit(t, d, "k", 1, prio(0))
		assert.Equal(t, StateSucceeded, outcome(t, tk).State)
		assert.False(t, d.Busy("k"))
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.CallbackPanics)
	})
}

// TestPanicsAreNotReexecuted: a panic in exec ends the call Failed with a
// *PanicError, even when the panic value is an error the classifier would
// retry: a half-done side effect is never repeated.
func TestPanicsAreNotReexecuted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runs := 0
		timeout := &net.OpError{Op: "dial", Err: syscall.ETIMEDOUT}
		d := newD(t, func(context.Context, string, int) error {
			runs++
			panic(timeout) // DefaultClassifier says Retry for a net timeout
		}, Config[string, int]{Workers: 1, Classify: func(error) Class { return ClassRetry }})
		r := outcome(t, waitFor(t, submit(t, d, "k", 1, prio(0))))
		assert.Equal(t, StateFailed, r.State)
		var pe *PanicError
		require.ErrorAs(t, r.Err, &pe)
		assert.Equal(t, callbackExec, pe.Callback)
		assert.Equal(t, 1, runs)
		assert.Equal(t, uint64(0), closeD(t, d).Retries)
	})
}

// waitFor waits for tk's outcome and returns tk.
func waitFor[K comparable, T any](t testing.TB, tk *Ticket[K, T]) *Ticket[K, T] {
	t.Helper()
	<-tk.Done()
	return tk
}

// TestCloseInSyncWaitsForInlineExecution: Close returns only after an
// inline (Sync) execution has returned.
func TestCloseInSyncWaitsForInlineExecution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		returned := make(chan struct{})
		d := newD(t, func(ctx context.Context, _ string, _ int) error {
			<-release // ignores ctx: Close must still wait for it
			close(returned)
			return nil
		}, Config[string, int]{Rollout: RolloutPolicy{Mode: ModeSync}})
		go func() { _, _ = d.Submit(context.Background(), "k", 1, SubmitOptions{}) }()
		synctest.Wait()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(context.Background()) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while the inline execution was running")
		default:
		}
		close(release)
		<-returned
		require.NoError(t, <-closed)
		checkConservation(t, d)
	})
}

// TestGoexitInExec: runtime.Goexit in exec (t.FailNow in a test's exec)
// ends the call Failed with a *PanicError whose Value is ErrGoexit, and the
// worker it took is replaced: with one worker, the next call still runs.
func TestGoexitInExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, func(_ context.Context, k string, _ int) error {
			if k == "exit" {
				runtime.Goexit()
			}
			return nil
		}, Config[string, int]{Workers: 1})
		r := outcome(t, waitFor(t, submit(t, d, "exit", 1, prio(0))))
		assert.Equal(t, StateFailed, r.State)
		var pe *PanicError
		require.ErrorAs(t, r.Err, &pe)
		assert.Equal(t, callbackExec, pe.Callback)
		assert.ErrorIs(t, r.Err, ErrGoexit)
		assert.False(t, d.Busy("exit"), "the key is not wedged")
		assert.Equal(t, StateSucceeded, outcome(t, waitFor(t, submit(t, d, "next", 1, prio(0)))).State)
		closeD(t, d)
	})
}

// TestTenantStateBounded: a tenant name outside Config.Tenants holds state
// only while it has calls, and a refused submission creates none, so
// made-up names cannot grow memory.
func TestTenantStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newD(t, nopExec, Config[string, int]{
			Workers: 1,
			Tenants: map[string]TenantConfig{"configured": {}},
		})
		var tks []*Ticket[string, int]
		for i := range 1000 {
			tks = append(tks, submit(t, d, fmt.Sprint(i), 1, SubmitOptions{Tenant: fmt.Sprint("t", i)}))
		}
		waitAll(tks...)
		s := d.Stats()
		assert.Len(t, s.Tenants, 2, "only the configured tenant and the tenant of no name remain: %v", s.Tenants)
		assert.Contains(t, s.Tenants, "configured")
		require.NoError(t, d.Close(bg))
		for i := range 10000 {
			assert.ErrorIs(t, d.Post("k", 1, SubmitOptions{Tenant: fmt.Sprint("closed", i)}), ErrClosed)
		}
		assert.Len(t, d.Stats().Tenants, 2, "refusals create no tenant state")
		checkConservation(t, d)
	})
}

// TestRetryRespectsTenantQuota: a retry going back to the queue needs room
// under its tenant's MaxQueued like any new call: it evicts the tenant's
// worst droppable queued call if it would run before it, and otherwise
// gives up with giveUpQuota.
func TestRetryRespectsTenantQuota(t *testing.T) {
	for _, tc := range []struct {
		name      string
		droppable bool
		want      State
	}{
		{"gives up", false, StateFailed},
		{"evicts a droppable call", true, StateSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				tries := 0
				d := newD(t, func(_ context.Context, k string, _ int) error {
					if k == "r" {
						<-release
						if tries++; tries == 1 {
							return syscall.ECONNRESET
						}
					}
					return nil
				}, Config[string, int]{
					Workers: 2,
					Retry:   noJitter(3),
					Tenants: map[string]TenantConfig{"t": {MaxQueued: 1, MaxInFlight: 1}},
				})
				r := submit(t, d, "r", 1, SubmitOptions{Tenant: "t", Priority: 5})
				synctest.Wait() // r runs; the tenant's one queued slot is free
				other := submit(t, d, "other", 1, SubmitOptions{Tenant: "t", Droppable: tc.droppable})
				close(release) // r fails retryably: its retry needs a slot
				synctest.Wait()
				s := d.Stats()
				assert.LessOrEqual(t, s.Tenants["t"].Queued, 1, "quota held")
				waitAll(r, other)
				rr := outcome(t, r)
				assert.Equal(t, tc.want, rr.State)
				if tc.want == StateFailed {
					var re *RetryError
					require.ErrorAs(t, rr.Err, &re)
					assert.Equal(t, giveUpQuota, re.Reason)
					assert.Equal(t, StateSucceeded, outcome(t, other).State)
				} else {
					assert.Equal(t, StateDropped, outcome(t, other).State)
				}
				closeD(t, d)
			})
		})
	}
}
