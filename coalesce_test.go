package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMerge coalesces submissions into a pending call (queued behind a held
// worker) with each kind of merge function, and checks what runs, what each
// waiter hears, and that a refused submission leaves the pending call as it
// was.
func TestMerge(t *testing.T) {
	errRefuse := errors.New("refused by merge")
	combine := func(p, in string) (string, error) { return p + "+" + in, nil }
	keepPending := func(p, _ string) (string, error) { return p, nil }
	keepIncoming := func(_, in string) (string, error) { return in, nil }
	refuseB := func(p, in string) (string, error) {
		if in == "b" {
			return "", errRefuse
		}
		return p + "+" + in, nil
	}
	tests := []struct {
		name    string
		merge   func(string, string) (string, error) // nil: no Config.Merge
		calls   []string
		refused []bool // per submission
		want    string // the value executed
	}{
		{"combine", combine, []string{"a", "b", "c"}, []bool{false, false, false}, "a+b+c"},
		{"keep pending (skip)", keepPending, []string{"a", "b", "c"}, []bool{false, false, false}, "a"},
		{"keep incoming (overwrite)", keepIncoming, []string{"a", "b", "c"}, []bool{false, false, false}, "c"},
		{"refuse", refuseB, []string{"a", "b", "c"}, []bool{false, true, false}, "a+c"},
		{"default replaces", nil, []string{"a", "b", "c"}, []bool{false, false, false}, "c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, string]()
				hooks := &hookLog[string, string]{}
				d, _, release := holdWorker(t, f.exec, Config[string, string]{
					Merge:  tc.merge,
					OnDone: hooks.add,
				})

				var accepted []*Ticket[string, string]
				for i, c := range tc.calls {
					tk, err := d.Submit(bg, "k", c, prio(0))
					if tc.refused[i] {
						require.Error(t, err)
						assert.Nil(t, tk)
						assert.ErrorIs(t, err, ErrMergeRejected)
						assert.ErrorIs(t, err, errRefuse, "the merge function's error is not wrapped")
						continue
					}
					require.NoError(t, err)
					accepted = append(accepted, tk)
				}
				s := checkConservation(t, d)
				assert.Equal(t, 2, s.Keys)
				assert.Equal(t, uint64(len(accepted)-1), s.Coalesced)
				release()

				assert.Equal(t, []string{tc.want}, f.calls("k"), "one execution with the merged value")
				for _, tk := range accepted {
					r := outcome(t, tk)
					assert.Equal(t, StateSucceeded, r.State)
					assert.Equal(t, tc.want, r.Call)
					assert.Equal(t, len(accepted), r.Waiters)
				}
				require.Len(t, hooks.of("k"), 1)
				assert.Equal(t, len(accepted), hooks.of("k")[0].Waiters)
				s = closeD(t, d)
				assert.Equal(t, uint64(len(tc.calls)-len(accepted)), s.Rejected)
			})
		})
	}
}

// TestMergeIdempotencyKey: a submission whose idempotency key differs from
// the pending call's is refused without consulting the merge function; an
// empty key merges with anything, and the pending call adopts the first
// non-empty key.
func TestMergeIdempotencyKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, string]()
		var merges atomic.Int32
		d, _, release := holdWorker(t, f.exec, Config[string, string]{
			Merge: func(p, in string) (string, error) {
				merges.Add(1)
				return p + "+" + in, nil
			},
		})

		var tks []*Ticket[string, string]
		tks = append(tks, submit(t, d, "k", "a", SubmitOptions{}))                    // no key yet
		tks = append(tks, submit(t, d, "k", "b", SubmitOptions{IdempotencyKey: "x"})) // adopts "x"
		tks = append(tks, submit(t, d, "k", "c", SubmitOptions{}))                    // empty merges
		tks = append(tks, submit(t, d, "k", "d", SubmitOptions{IdempotencyKey: "x"})) // same key merges
		require.Equal(t, int32(3), merges.Load())

		_, err := d.Submit(bg, "k", "e", SubmitOptions{IdempotencyKey: "y"})
		require.ErrorIs(t, err, ErrMergeRejected)
		err = d.Post("k", "f", SubmitOptions{IdempotencyKey: "z"})
		require.ErrorIs(t, err, ErrMergeRejected)
		assert.Equal(t, int32(3), merges.Load(), "merge consulted for a different idempotency key")

		release()
		assert.Equal(t, []string{"a+b+c+d"}, f.calls("k"))
		assert.Equal(t, map[State]int{StateSucceeded: 4}, tally(t, tks...))
		s := closeD(t, d)
		assert.Equal(t, uint64(2), s.Rejected)
	})
}

// TestMergePanic: a merge function that panics rejects the submission (as a
// refused merge), leaves the pending call untouched, and the dispatcher —
// whose lock the merge ran under — keeps working.
func TestMergePanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, string]()
		d, _, release := holdWorker(t, f.exec, Config[string, string]{
			Merge: func(p, in string) (string, error) {
				if in == "boom" {
					panic("merge exploded")
				}
				return p + "+" + in, nil
			},
		})
		tks := []*Ticket[string, string]{submit(t, d, "k", "a", prio(0))}

		tk, err := d.Submit(bg, "k", "boom", prio(0))
		require.Error(t, err)
		assert.Nil(t, tk)
		assert.ErrorIs(t, err, ErrMergeRejected)
		var pe *PanicError
		require.ErrorAs(t, err, &pe, "the panic, with its stack")
		assert.Equal(t, callbackMerge, pe.Callback)
		assert.Equal(t, "merge exploded", pe.Value)
		require.ErrorIs(t, d.Post("k", "boom", SubmitOptions{}), ErrMergeRejected)

		// Still working: the lock was released, merges and new keys go on.
		tks = append(tks, submit(t, d, "k", "b", prio(0)))
		tks = append(tks, submit(t, d, "other", "x", prio(0)))
		assert.True(t, d.Busy("k"))
		release()
		assert.Equal(t, []string{"a+b"}, f.calls("k"))
		assert.Equal(t, []string{"x"}, f.calls("other"))
		assert.Equal(t, map[State]int{StateSucceeded: 3}, tally(t, tks...))
		s := closeD(t, d)
		assert.Equal(t, uint64(2), s.Rejected)
	})
}

// TestNoOp: a call the no-op test finds would change nothing is not
// executed and ends Skipped, which counts as success; the test sees the
// merged value.
func TestNoOp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		hooks := &hookLog[string, int]{}
		var seen []int
		var mu sync.Mutex
		d, _, release := holdWorker(t, f.exec, Config[string, int]{
			Merge: func(p, in int) (int, error) { return p + in, nil },
			NoOp: func(key string, v int) bool {
				mu.Lock()
				seen = append(seen, v)
				mu.Unlock()
				return v == 0
			},
			OnDone: hooks.add,
		})
		skip1 := submit(t, d, "skip", 1, prio(0))
		skip2 := submit(t, d, "skip", -1, prio(0)) // merged value 0: a no-op
		require.NoError(t, d.Post("skip", 0, SubmitOptions{}))
		run := submit(t, d, "run", 5, prio(0))
		release()

		assert.Equal(t, []string{"run"}, f.keys(), "a no-op call was executed")
		for _, tk := range []*Ticket[string, int]{skip1, skip2} {
			r := outcome(t, tk)
			assert.Equal(t, StateSkipped, r.State)
			assert.True(t, r.State.OK())
			assert.Zero(t, r.Attempts)
			assert.Equal(t, 3, r.Waiters)
		}
		assert.Equal(t, StateSucceeded, outcome(t, run).State)
		assert.Equal(t, []State{StateSkipped}, hooks.states("skip"))
		mu.Lock()
		assert.ElementsMatch(t, []int{0, 5}, seen, "the no-op test sees each call once, as merged")
		mu.Unlock()
		s := closeD(t, d)
		assert.Equal(t, map[State]int{StateSucceeded: 2, StateSkipped: 3}, counts(s.Outcomes))
		assert.Equal(t, uint64(2), s.Executions)
	})
}

// TestExecSkipCall: an exec that returns SkipCall, or wraps it, ends its
// call Skipped — a success, not retried, the one execution counted — in
// async and Sync mode alike; an error that is not it is still judged.
func TestExecSkipCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		var runs atomic.Int32
		exec := func(ctx context.Context, key string, v int) error {
			runs.Add(1)
			switch v {
			case 1:
				return SkipCall
			case 2:
				return fmt.Errorf("read %s: already so: %w", key, SkipCall)
			}
			return errors.New("boom")
		}
		d := newD(t, exec, Config[string, int]{
			Classify: func(error) Class { return ClassPermanent },
			OnDone:   hooks.add,
		})
		plain := submit(t, d, "plain", 1, prio(0))
		wrapped := submit(t, d, "wrapped", 2, prio(0))
		failed := submit(t, d, "failed", 3, prio(0))
		synctest.Wait()
		for _, tk := range []*Ticket[string, int]{plain, wrapped} {
			r := outcome(t, tk)
			assert.Equal(t, StateSkipped, r.State)
			assert.NoError(t, r.Err)
			assert.Equal(t, 1, r.Attempts, "it ran once, and is not retried")
		}
		assert.Equal(t, StateFailed, outcome(t, failed).State)
		assert.Equal(t, []State{StateSkipped}, hooks.states("wrapped"))

		require.NoError(t, d.SetMode(bg, ModeSync))
		sync, err := d.Submit(bg, "sync", 1, SubmitOptions{})
		require.NoError(t, err)
		assert.Equal(t, StateSkipped, outcome(t, sync).State, "inline, as on a worker")
		assert.Equal(t, int32(4), runs.Load())
		s := closeD(t, d)
		assert.Equal(t, map[State]int{StateSkipped: 3, StateFailed: 1}, counts(s.Outcomes))
		assert.Equal(t, uint64(4), s.Executions)
	})
}

// TestSuccessor: a submission for a key whose call is in flight waits for
// it (even with idle workers), coalesces with later ones, and when released
// keeps its original enqueue time: it beats calls submitted later with an
// equal or higher virtual time, and loses to ones with a lower one.
func TestSuccessor(t *testing.T) {
	t.Run("waits for the in-flight call", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			g := f.block("A")
			var inflight, maxInflight atomic.Int32
			exec := func(ctx context.Context, key string, call int) error {
				n := inflight.Add(1)
				defer inflight.Add(-1)
				for {
					m := maxInflight.Load()
					if n <= m || maxInflight.CompareAndSwap(m, n) {
						break
					}
				}
				return f.exec(ctx, key, call)
			}
			d := newD(t, exec, Config[string, int]{Workers: 4})
			first := submit(t, d, "A", 1, prio(0))
			synctest.Wait()
			succ := submit(t, d, "A", 2, prio(0))
			synctest.Wait()
			s := checkConservation(t, d)
			assert.Equal(t, 1, s.Successors)
			assert.Equal(t, 1, s.InFlight)
			assert.Equal(t, 1, s.Keys)
			assert.Equal(t, []string{"A"}, f.keys(), "the successor started while the key was in flight")
			select {
			case <-succ.Done():
				t.Fatal("successor finished while waiting")
			default:
			}
			g.open()
			synctest.Wait()
			assert.Equal(t, []int{1, 2}, f.calls("A"))
			assert.Equal(t, int32(1), maxInflight.Load())
			assert.Equal(t, map[State]int{StateSucceeded: 2}, tally(t, first, succ))
			closeD(t, d)
		})
	})
	t.Run("keeps its place", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			d, _, release := holdWorker(t, f.exec, Config[string, int]{ // held from 0s
				Aging: time.Second,
				Merge: func(p, in int) (int, error) { return p*10 + in, nil },
			})
			time.Sleep(time.Second)
			succ := submit(t, d, holdKey, 2, prio(0)) // successor, vt 1s
			tks := []*Ticket[string, int]{succ}
			tks = append(tks, submit(t, d, holdKey, 3, prio(0))) // coalesces into it
			time.Sleep(time.Second)
			tks = append(tks, submit(t, d, "B", 0, prio(0))) // vt 2s: later
			tks = append(tks, submit(t, d, "C", 0, prio(1))) // vt 1s: ties, arrived later
			tks = append(tks, submit(t, d, "D", 0, prio(2))) // vt 0s: earlier
			s := checkConservation(t, d)
			assert.Equal(t, 1, s.Successors)
			assert.Equal(t, 3, s.Ready)
			assert.Equal(t, uint64(1), s.Coalesced)
			time.Sleep(time.Second)
			release() // at 3s
			assert.Equal(t, []string{"D", holdKey, "C", "B"}, f.keys())
			assert.Equal(t, []int{23}, f.calls(holdKey))
			r := outcome(t, succ)
			assert.Equal(t, 23, r.Call)
			assert.Equal(t, 2, r.Waiters)
			assert.Equal(t, 2*time.Second, r.QueueWait, "the successor's queue wait does not start at its submission")
			assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
			closeD(t, d)
		})
	})
}

// TestPriorityInheritance: a waiter joining a pending call raises the call
// to the highest priority (and earliest enqueue time) of its live waiters,
// and when that waiter leaves — by Ticket.Cancel, its context, or its
// deadline — the call falls back.
func TestPriorityInheritance(t *testing.T) {
	tests := []struct {
		name string
		// run queues calls behind the held worker and returns the order in
		// which A and B must run.
		run func(t *testing.T, d *Dispatcher[string, int]) (want []string, outcomes map[State]int, tks []*Ticket[string, int])
	}{
		{"up", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			a2 := submit(t, d, "A", 0, prio(10))
			return []string{"A", "B"}, map[State]int{StateSucceeded: 3}, []*Ticket[string, int]{a1, b, a2}
		}},
		{"up by fire-and-forget", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			require.NoError(t, d.Post("A", 0, prio(10)))
			return []string{"A", "B"}, map[State]int{StateSucceeded: 2}, []*Ticket[string, int]{a1, b}
		}},
		{"up then down by Ticket.Cancel", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			a2 := submit(t, d, "A", 0, prio(10))
			a2.Cancel()
			r := outcome(t, a2)
			assert.Equal(t, StateCanceled, r.State)
			return []string{"B", "A"}, map[State]int{StateSucceeded: 2, StateCanceled: 1}, []*Ticket[string, int]{a1, b, a2}
		}},
		{"up then down by context", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			ctx, cancel := context.WithCancel(bg)
			a2, err := d.Submit(ctx, "A", 0, prio(10))
			require.NoError(t, err)
			cancel()
			synctest.Wait()
			assert.Equal(t, StateCanceled, outcome(t, a2).State)
			return []string{"B", "A"}, map[State]int{StateSucceeded: 2, StateCanceled: 1}, []*Ticket[string, int]{a1, b, a2}
		}},
		{"up then down by deadline", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			a2 := submit(t, d, "A", 0, SubmitOptions{Priority: 10, Deadline: time.Now().Add(time.Second)})
			time.Sleep(2 * time.Second)
			assert.Equal(t, StateExpired, outcome(t, a2).State)
			return []string{"B", "A"}, map[State]int{StateSucceeded: 2, StateExpired: 1}, []*Ticket[string, int]{a1, b, a2}
		}},
		{"up then down by fire-and-forget deadline", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0))
			b := submit(t, d, "B", 0, prio(5))
			require.NoError(t, d.Post("A", 0, SubmitOptions{Priority: 10, Deadline: time.Now().Add(time.Second)}))
			time.Sleep(2 * time.Second)
			return []string{"B", "A"}, map[State]int{StateSucceeded: 2}, []*Ticket[string, int]{a1, b}
		}},
		{"posts, then a ticket that leaves", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			require.NoError(t, d.Post("A", 0, prio(0)))
			b := submit(t, d, "B", 0, prio(5))
			a := submit(t, d, "A", 0, prio(10))
			a.Cancel() // A falls back to its posts' priority
			return []string{"B", "A"}, map[State]int{StateSucceeded: 1, StateCanceled: 1}, []*Ticket[string, int]{b, a}
		}},
		{"a ticket, then posts, then the ticket leaves", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a := submit(t, d, "A", 0, prio(10))
			b := submit(t, d, "B", 0, prio(5))
			require.NoError(t, d.Post("A", 0, prio(0)))
			a.Cancel() // A falls to its posts' priority
			return []string{"B", "A"}, map[State]int{StateSucceeded: 1, StateCanceled: 1}, []*Ticket[string, int]{b, a}
		}},
		{"posts gather under a ticket", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			require.NoError(t, d.Post("A", 0, prio(0))) // 0s
			time.Sleep(time.Second / 2)
			b := submit(t, d, "B", 0, prio(1)) // 0.5s: B's virtual time is −0.5s
			time.Sleep(3 * time.Second / 2)
			a := submit(t, d, "A", 0, prio(3)) // 2s
			time.Sleep(time.Second)
			require.NoError(t, d.Post("A", 0, prio(2))) // 3s: the posts now have priority 2, enqueued at 0s
			a.Cancel()                                  // A is its posts again: virtual time −2s
			return []string{"A", "B"}, map[State]int{StateSucceeded: 1, StateCanceled: 1}, []*Ticket[string, int]{b, a}
		}},
		{"enqueue time follows live waiters", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			// Aging 1s, equal priorities: order is by enqueue time.
			a1 := submit(t, d, "A", 0, prio(0)) // 0s
			time.Sleep(time.Second)
			b := submit(t, d, "B", 0, prio(0)) // 1s
			time.Sleep(time.Second)
			a2 := submit(t, d, "A", 0, prio(0)) // 2s: A keeps 0s
			a1.Cancel()                         // A's earliest live waiter is now 2s
			return []string{"B", "A"}, map[State]int{StateSucceeded: 2, StateCanceled: 1}, []*Ticket[string, int]{a1, b, a2}
		}},
		{"enqueue time kept while the first waiter stays", func(t *testing.T, d *Dispatcher[string, int]) ([]string, map[State]int, []*Ticket[string, int]) {
			a1 := submit(t, d, "A", 0, prio(0)) // 0s
			time.Sleep(time.Second)
			b := submit(t, d, "B", 0, prio(0)) // 1s
			time.Sleep(time.Second)
			a2 := submit(t, d, "A", 0, prio(0)) // 2s
			a2.Cancel()
			return []string{"A", "B"}, map[State]int{StateSucceeded: 2, StateCanceled: 1}, []*Ticket[string, int]{a1, b, a2}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture[string, int]()
				d, _, release := holdWorker(t, f.exec, Config[string, int]{Aging: time.Second})
				want, outcomes, tks := tc.run(t, d)
				release()
				assert.Equal(t, want, f.keys())
				assert.Equal(t, outcomes, tally(t, tks...))
				closeD(t, d)
			})
		})
	}
}

// TestNeverConcurrentPerKey hammers few keys from many goroutines with
// many workers — submissions, fire-and-forget, merges, waiter cancels,
// context timeouts, Cancel(key) and generation bumps, with executions that
// ignore their context and so outlive their cancellation — and checks with
// a per-key in-flight counter that no key ever runs twice at once. Every
// waiter hears exactly once and conservation holds throughout.
func TestNeverConcurrentPerKey(t *testing.T) {
	t.Run("plain", func(t *testing.T) { neverConcurrentPerKey(t, false) })
	// With retryable failures (retries wait in the delay index as the key's
	// pending call) and a merge that sometimes refuses (a successor that
	// cannot be absorbed by a retry waits behind it).
	t.Run("retries and refused merges", func(t *testing.T) { neverConcurrentPerKey(t, true) })
}

var errFlaky = errors.New("flaky")

func neverConcurrentPerKey(t *testing.T, retries bool) {
	synctest.Test(t, func(t *testing.T) {
		const (
			keys       = 4
			workers    = 16
			submitters = 24
			perSub     = 200
		)
		var (
			inflight   [keys]atomic.Int32
			violations atomic.Int32
			execs      atomic.Uint64
			hooks      atomic.Uint64
			gens       [keys]atomic.Uint64
		)
		exec := func(ctx context.Context, key int, call int) error {
			if inflight[key].Add(1) != 1 {
				violations.Add(1)
			}
			execs.Add(1)
			switch uint(call) % 4 {
			case 0:
				runtime.Gosched()
			case 1:
				time.Sleep(time.Duration(uint(call)%5) * time.Millisecond) // ignores ctx
			case 2:
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			case 3:
				for range 3 {
					runtime.Gosched()
				}
			}
			if inflight[key].Add(-1) != 0 {
				violations.Add(1)
			}
			if retries && uint(call)%3 == 0 {
				return errFlaky
			}
			return nil
		}
		merge := func(p, in int) (int, error) { return p ^ in, nil }
		cfg := Config[int, int]{
			Workers: workers,
			OnDone:  func(Result[int, int]) { hooks.Add(1) },
		}
		if retries {
			merge = func(p, in int) (int, error) {
				if uint(in)%5 == 0 {
					return p, errUser
				}
				return p ^ in, nil
			}
			cfg.Classify = func(err error) Class {
				if errors.Is(err, errFlaky) {
					return ClassRetry
				}
				return ClassPermanent
			}
			cfg.Retry = RetryPolicy{
				MaxAttempts:    4,
				InitialBackoff: time.Millisecond,
				MaxBackoff:     4 * time.Millisecond,
				BudgetRatio:    math.Inf(1),
			}
		}
		cfg.Merge = merge
		d := newD(t, exec, cfg)

		var (
			mu         sync.Mutex
			all        []*Ticket[int, int]
			unexpected []error
			attempts   atomic.Uint64
			rejected   atomic.Uint64
		)
		var wg sync.WaitGroup
		for s := range submitters {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(s), 99))
				var mine, held []*Ticket[int, int]
				var errs []error
				for range perSub {
					key := r.IntN(keys)
					o := SubmitOptions{Priority: r.IntN(5), Generation: gens[key].Load()}
					var err error
					attempts.Add(1)
					switch op := r.IntN(100); {
					case op < 50:
						var tk *Ticket[int, int]
						tk, err = d.Submit(bg, key, r.Int(), o)
						if err == nil {
							mine = append(mine, tk)
							if r.IntN(3) == 0 {
								<-tk.Done()
							} else {
								held = append(held, tk)
							}
						}
					case op < 62:
						ctx, cancel := context.WithTimeout(bg, time.Duration(r.IntN(3))*time.Millisecond+time.Microsecond)
						var tk *Ticket[int, int]
						tk, err = d.Submit(ctx, key, r.Int(), o)
						if err == nil {
							mine = append(mine, tk)
						}
						if r.IntN(2) == 0 {
							time.Sleep(time.Millisecond)
						}
						cancel()
					case op < 85:
						if r.IntN(2) == 0 {
							o.Deadline = time.Now().Add(time.Duration(1+r.IntN(3)) * time.Millisecond)
						}
						err = d.Post(key, r.Int(), o)
					case op < 95:
						attempts.Add(^uint64(0)) // not a submission
						if len(held) > 0 {
							i := r.IntN(len(held))
							held[i].Cancel()
							held = append(held[:i], held[i+1:]...)
						}
					case op < 97:
						attempts.Add(^uint64(0))
						d.Cancel(key, errUser)
					default:
						o.Generation = gens[key].Add(1)
						var tk *Ticket[int, int]
						tk, err = d.Submit(bg, key, r.Int(), o)
						if err == nil {
							mine = append(mine, tk)
						}
					}
					if err != nil {
						rejected.Add(1)
						if !errors.Is(err, ErrStale) && !(retries && errors.Is(err, ErrMergeRejected)) {
							errs = append(errs, err)
						}
					}
					if r.IntN(10) == 0 {
						if err := conserved(d.Stats()); err != nil {
							errs = append(errs, err)
						}
					}
				}
				mu.Lock()
				all = append(all, mine...)
				unexpected = append(unexpected, errs...)
				mu.Unlock()
			})
		}
		wg.Wait()
		s := closeD(t, d)
		require.Empty(t, unexpected)
		assert.Zero(t, violations.Load(), "a key was executed twice at once")
		assert.Equal(t, execs.Load(), s.Executions)
		assert.Equal(t, attempts.Load(), s.Submitted)
		assert.Equal(t, rejected.Load(), s.Rejected)
		assert.Equal(t, hooks.Load(), total(s.Calls), "hook calls vs Stats.Calls")
		told := tally(t, all...)
		for st, n := range told {
			assert.LessOrEqual(t, uint64(n), s.Outcomes[st], "tickets with state %v", st)
		}
		t.Logf("submitted %d rejected %d executions %d stale %d retries %d outcomes %v",
			s.Submitted, s.Rejected, s.Executions, s.StaleExecutions, s.Retries, counts(s.Outcomes))
		if retries {
			assert.NotZero(t, s.Retries)
		}
		assert.NotZero(t, s.StaleExecutions, "the mix should orphan some executions")
	})
}

// TestSuccessorWaiters: a successor's waiters behave like a pending call's
// — a joiner raises its priority for when it is released, and when its
// last waiter leaves it is removed without running.
func TestSuccessorWaiters(t *testing.T) {
	t.Run("inherits priority", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			d, _, release := holdWorker(t, f.exec, Config[string, int]{Aging: time.Second})
			var tks []*Ticket[string, int]
			tks = append(tks, submit(t, d, "B", 0, prio(5)))
			tks = append(tks, submit(t, d, holdKey, 2, prio(0)))  // successor
			tks = append(tks, submit(t, d, holdKey, 2, prio(10))) // raises it
			release()
			assert.Equal(t, []string{holdKey, "B"}, f.keys())
			assert.Equal(t, map[State]int{StateSucceeded: 3}, tally(t, tks...))
			closeD(t, d)
		})
	})
	t.Run("removed when its last waiter leaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			hooks := &hookLog[string, int]{}
			d, _, release := holdWorker(t, f.exec, Config[string, int]{OnDone: hooks.add})
			s1 := submit(t, d, holdKey, 2, SubmitOptions{Deadline: time.Now().Add(time.Second)})
			s2 := submit(t, d, holdKey, 2, prio(0))
			s2.Cancel()
			require.Equal(t, 1, d.Stats().Successors)
			time.Sleep(2 * time.Second)
			s := checkConservation(t, d)
			assert.Zero(t, s.Successors, "successor without waiters kept")
			assert.Equal(t, 1, s.InFlight)
			assert.Equal(t, StateExpired, outcome(t, s1).State)
			assert.Equal(t, StateCanceled, outcome(t, s2).State)
			release()
			assert.Empty(t, f.calls(holdKey), "a successor without waiters ran")
			assert.ElementsMatch(t, []State{StateExpired, StateSucceeded}, hooks.states(holdKey))
			closeD(t, d)
		})
	})
}

// TestFireAndForgetDeadline: fire-and-forget submissions merged into one
// call share the latest of their deadlines; one without a deadline never
// leaves; when they expire, the call's priority falls back (or the call
// goes, if nobody else waits).
func TestFireAndForgetDeadline(t *testing.T) {
	t.Run("latest deadline, then removed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			hooks := &hookLog[string, int]{}
			d, _, release := holdWorker(t, f.exec, Config[string, int]{OnDone: hooks.add})
			now := time.Now()
			require.NoError(t, d.Post("A", 0, SubmitOptions{Deadline: now.Add(3 * time.Second)}))
			require.NoError(t, d.Post("A", 0, SubmitOptions{Deadline: now.Add(time.Second)}))
			time.Sleep(2 * time.Second)
			s := checkConservation(t, d)
			assert.True(t, d.Busy("A"), "expired at the earliest, not the latest, deadline")
			assert.Equal(t, 3, s.Live)
			time.Sleep(2 * time.Second)
			s = checkConservation(t, d)
			assert.False(t, d.Busy("A"))
			assert.Equal(t, uint64(2), s.Outcomes[StateExpired])
			assert.Equal(t, []State{StateExpired}, hooks.states("A"))
			release()
			assert.Empty(t, f.keys(), "a call without waiters ran")
			closeD(t, d)
		})
	})
	t.Run("one without deadline never leaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			d, _, release := holdWorker(t, f.exec, Config[string, int]{})
			require.NoError(t, d.Post("A", 0, SubmitOptions{Deadline: time.Now().Add(time.Second)}))
			require.NoError(t, d.Post("A", 0, SubmitOptions{}))
			time.Sleep(time.Hour)
			assert.True(t, d.Busy("A"))
			release()
			assert.Equal(t, []string{"A"}, f.keys())
			s := closeD(t, d)
			assert.Equal(t, map[State]int{StateSucceeded: 3}, counts(s.Outcomes))
		})
	})
}

// TestHookResubmits: the completion hook runs outside every lock, so it may
// submit again — the "re-evaluate this object" loop.
func TestHookResubmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		var d *Dispatcher[string, int]
		var errs []error
		var mu sync.Mutex
		d = newD(t, f.exec, Config[string, int]{
			Workers: 2,
			OnDone: func(r Result[string, int]) {
				if r.Call < 3 {
					err := d.Post(r.Key, r.Call+1, SubmitOptions{})
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			},
		})
		tk := submit(t, d, "k", 0, prio(0))
		_, err := tk.Wait(bg)
		require.NoError(t, err)
		synctest.Wait()
		assert.Equal(t, []int{0, 1, 2, 3}, f.calls("k"))
		mu.Lock()
		assert.Equal(t, []error{nil, nil, nil}, errs)
		mu.Unlock()
		closeD(t, d)
	})
}

// TestMergeSkipIncoming: a merge that returns SkipIncoming ends the
// incoming submission Skipped at once — it does not wait for the pending
// call's outcome — and leaves the pending call as it was. A successor that
// a retry absorbs is skipped the same way.
func TestMergeSkipIncoming(t *testing.T) {
	// Relevance as in kube-scheduler: a deletion makes a patch moot.
	merge := func(pending, incoming string) (string, error) {
		if pending == "delete" && incoming != "delete" {
			return "", fmt.Errorf("pod is being deleted: %w", SkipIncoming)
		}
		return incoming, nil
	}
	t.Run("onto a pending call", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, string]()
			d, _, release := holdWorker(t, f.exec, Config[string, string]{Merge: merge})
			del := submit(t, d, "pod", "delete", prio(0))
			patch := submit(t, d, "pod", "patch", prio(5))
			require.NoError(t, d.Post("pod", "patch", SubmitOptions{}))
			r := outcome(t, patch) // at once, while "delete" still waits
			assert.Equal(t, StateSkipped, r.State)
			assert.Equal(t, "patch", r.Call)
			assert.Zero(t, r.Attempts)
			assert.True(t, d.Busy("pod"))
			s := checkConservation(t, d)
			assert.Equal(t, uint64(2), s.Outcomes[StateSkipped])
			assert.Equal(t, uint64(2), s.Coalesced)
			release()
			assert.Equal(t, StateSucceeded, outcome(t, del).State)
			assert.Equal(t, []string{"delete"}, f.calls("pod"), "the patch never ran, nor raised the deletion's priority")
			closeD(t, d)
		})
	})
	t.Run("a successor waits behind a retry that finds it moot", func(t *testing.T) {
		// The successor arrived while the deletion ran,
		// so it was never judged against a pending call; the retry may
		// still fail. It waits behind the retry and runs after it.
		synctest.Test(t, func(t *testing.T) {
			var runs []string
			first := true
			release := make(chan struct{})
			hooks := &hookLog[string, string]{}
			d := newD(t, func(ctx context.Context, k, v string) error {
				runs = append(runs, v)
				if first {
					first = false
					<-release
					return syscall.ECONNRESET
				}
				return nil
			}, Config[string, string]{
				Workers: 1,
				Merge:   merge,
				OnDone:  hooks.add,
				Retry:   noJitter(3),
			})
			del := submit(t, d, "pod", "delete", prio(0))
			synctest.Wait() // in flight
			patch := submit(t, d, "pod", "patch", prio(0))
			close(release)
			synctest.Wait()
			_, ended := patch.Result()
			assert.False(t, ended, "the successor was skipped by the retry")
			waitAll(del, patch)
			assert.Equal(t, StateSucceeded, outcome(t, del).State)
			assert.Equal(t, StateSucceeded, outcome(t, patch).State)
			assert.Equal(t, []string{"delete", "delete", "patch"}, runs)
			s := closeD(t, d)
			assert.Equal(t, uint64(2), s.Calls[StateSucceeded])
		})
	})
}

// TestMergeAdoptsUrgentTenantAndLabel: a submission that raises a pending
// call's priority also gives it its tenant and label, so that a binding
// which replaces a pending status patch is capped, counted and labelled as
// a binding.
func TestMergeAdoptsUrgentTenantAndLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, string]()
		obs := &finishHook{}
		var mu sync.Mutex
		var seen []Event
		obs.f = func(e Event, _ Outcome) {
			mu.Lock()
			seen = append(seen, e)
			mu.Unlock()
		}
		d, _, release := holdWorker(t, f.exec, Config[string, string]{
			Label:    func(_ string, v string) string { return v },
			Merge:    func(p, in string) (string, error) { return in, nil },
			Observer: obs,
			Tenants:  map[string]TenantConfig{"patches": {}, "binds": {}},
		})
		require.NoError(t, d.Post("pod", "patch", SubmitOptions{Tenant: "patches"}))
		s := d.Stats()
		assert.Equal(t, 1, s.Tenants["patches"].Queued)
		bind := submit(t, d, "pod", "bind", SubmitOptions{Tenant: "binds", Priority: 10})
		s = d.Stats()
		assert.Equal(t, 0, s.Tenants["patches"].Queued)
		assert.Equal(t, 1, s.Tenants["binds"].Queued)
		assert.Equal(t, map[string]int{"bind": 1, "": 1}, s.Labels)
		// A lower-priority submission joins without changing either.
		require.NoError(t, d.Post("pod", "bind", SubmitOptions{Tenant: "patches"}))
		assert.Equal(t, 1, d.Stats().Tenants["binds"].Queued)
		release()
		waitAll(bind)
		mu.Lock()
		assert.Contains(t, seen, Event{Label: "bind", Tenant: "binds"})
		mu.Unlock()
		closeD(t, d)
	})
}

// TestReplacePendingStartsFresh: a merge that
// returns ReplacePending makes the incoming call a new operation. A
// binding that replaces a status patch waiting out its retry's backoff
// runs at once, from its first attempt, without the patch's last error
// (the before-retry hook, which checks an earlier attempt, does not run),
// and — though at a lower priority than the call it replaced, as a
// deletion replacing a binding is — in its own tenant and under its own
// label. A plain merge result keeps the retry state: it is the same
// operation, updated.
func TestReplacePendingStartsFresh(t *testing.T) {
	kind := func(v string) string { return strings.SplitN(v, ":", 2)[0] }
	merge := func(p, in string) (string, error) {
		if kind(p) != kind(in) {
			return in, ReplacePending
		}
		return in, nil
	}
	for _, tc := range []struct {
		name, first, second string
		fresh               bool
	}{
		{"another operation", "patch:1", "bind:n1", true},
		{"the same operation, updated", "patch:1", "patch:2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var hookRuns []string
				attempts := map[string]int{}
				var seen []Event
				obs := &finishHook{f: func(e Event, _ Outcome) {
					mu.Lock()
					seen = append(seen, e)
					mu.Unlock()
				}}
				d := newD(t, func(_ context.Context, _ string, v string) error {
					mu.Lock()
					defer mu.Unlock()
					attempts[kind(v)]++
					if kind(v) == "patch" && attempts["patch"] == 1 {
						return syscall.ECONNRESET // the first attempt only
					}
					return nil
				}, Config[string, string]{
					Workers:  1,
					Merge:    merge,
					Label:    func(_ string, v string) string { return kind(v) },
					Observer: obs,
					Retry:    RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, Jitter: JitterNone},
					BeforeRetry: func(_ context.Context, _ string, v string, _ error) (string, bool, error) {
						mu.Lock()
						hookRuns = append(hookRuns, v)
						mu.Unlock()
						return v, false, nil
					},
				})
				first := submit(t, d, "pod", tc.first, SubmitOptions{Priority: 5, Tenant: kind(tc.first)})
				synctest.Wait() // failed once: waiting out a minute's backoff
				require.Equal(t, 1, d.Stats().Delayed)
				at := time.Now()
				second := submit(t, d, "pod", tc.second, SubmitOptions{Priority: 1, Tenant: kind(tc.second)})
				waitAll(first, second)
				r := outcome(t, second)
				assert.Equal(t, outcome(t, first), r, "both waiters share one outcome")
				if tc.fresh {
					assert.Equal(t, StateSucceeded, r.State)
					assert.Equal(t, 1, r.Attempts, "the replacement inherited the patch's attempts")
					assert.Equal(t, at, time.Now(), "the replacement waited out the patch's backoff")
					assert.Empty(t, hookRuns, "the before-retry hook ran on the patch's error")
					synctest.Wait() // the observer hears of the end after the waiters are told
					mu.Lock()
					assert.Equal(t, []Event{{Label: "bind", Tenant: "bind"}}, seen, "not counted as its own operation")
					mu.Unlock()
				} else {
					assert.Equal(t, 2, r.Attempts, "an update keeps the retry's attempts")
					assert.Equal(t, at.Add(time.Minute), time.Now(), "an update keeps the retry's backoff")
					assert.Equal(t, []string{tc.second}, hookRuns)
				}
				closeD(t, d)
			})
		})
	}
}

// TestRetryBecomesReplacingSuccessor: a successor that
// arrived while its key's call ran, and whose merge into that call's retry
// says ReplacePending, replaces the retry and runs at once from its first
// attempt.
func TestRetryBecomesReplacingSuccessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		var runs []string
		d := newD(t, func(_ context.Context, _ string, v string) error {
			mu.Lock()
			runs = append(runs, v)
			mu.Unlock()
			if v == "patch" {
				<-release
				return syscall.ECONNRESET
			}
			return nil
		}, Config[string, string]{
			Workers: 1,
			Merge:   func(p, in string) (string, error) { return in, ReplacePending },
			Retry:   RetryPolicy{InitialBackoff: time.Hour, Jitter: JitterNone},
		})
		patch := submit(t, d, "pod", "patch", prio(0))
		synctest.Wait()
		bind := submit(t, d, "pod", "bind", prio(0))
		at := time.Now()
		close(release)
		waitAll(patch, bind)
		r := outcome(t, bind)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, 1, r.Attempts)
		assert.Equal(t, at, time.Now(), "the replacement waited out the retry's backoff")
		assert.Equal(t, []string{"patch", "bind"}, runs)
		closeD(t, d)
	})
}

// TestCoalescedCountsEachSubmissionOnce: Stats.Coalesced counts the
// submissions served by a call another submission made, each once. A
// successor that already holds a submission merged into it (counted
// then), absorbed by its key's retry, adds its own submission alone: three
// submissions served by one call are two coalesced, not three — and a
// chain of such merges never counts more coalesced than submitted.
func TestCoalescedCountsEachSubmissionOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, s, release := retryOnce(t)
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()                                 // in flight
		second := submit(t, d, "k", 2, SubmitOptions{}) // the successor
		third := submit(t, d, "k", 3, SubmitOptions{})  // merged into the successor
		assert.Equal(t, uint64(1), d.Stats().Coalesced, "the third, merged into the second")
		close(release)
		for _, tk := range []*Ticket[string, int]{first, second, third} {
			r, _ := tk.Wait(bg)
			assert.Equal(t, StateSucceeded, r.State)
		}
		assert.Equal(t, 2, int(s.calls.Load()), "one retry served all three")
		st := closeD(t, d)
		assert.Equal(t, uint64(3), st.Submitted)
		assert.Equal(t, uint64(2), st.Coalesced, "three submissions served by one call: two coalesced into it")
	})
}
