package dispatch

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSupersedeKeepsTenant: a submission of a newer generation ends the
// key's calls (Stale) before it makes its own. When the call it ends was
// the last of a tenant that Config.Tenants does not name, finish forgets
// the tenant (forgetIdle) — but the submission goes on with it, and its
// new call is counted in a tenant the dispatcher no longer knows (admit
// calls keep only when it shed a victim). The next submission of that
// tenant gets a fresh one: the tenant's MaxQueued is passed (two calls
// queued, quota one), and Stats.Tenants no longer counts the first call,
// nor the tenant's earlier submissions.
//
// Found by TestChaosSoak's quota invariant, with the DefaultTenant's quota
// on tenant "a".
func TestSupersedeKeepsTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{DefaultTenant: TenantConfig{MaxQueued: 1}})
		submit(t, d, "k1", 1, SubmitOptions{Tenant: "a"})
		submit(t, d, "k1", 2, SubmitOptions{Tenant: "a", Generation: 1}) // k1's call of generation 0 ends Stale
		tk, err := d.Submit(bg, "k2", 3, SubmitOptions{Tenant: "a"})
		st := d.Stats()
		assert.ErrorIs(t, err, ErrBackpressure, "tenant a has k1's call queued, and may queue one")
		queued := 0
		for _, ts := range st.Tenants {
			queued += ts.Queued
		}
		assert.Equal(t, st.Ready+st.Delayed+st.Successors, queued, "Stats.Tenants counts every queued call: %+v", st.Tenants)
		assert.Equal(t, uint64(2), st.Tenants["a"].Admitted, "tenant a's admissions: %+v", st.Tenants["a"])
		release()
		if tk != nil {
			<-tk.Done()
		}
		closeD(t, d)
	})
}

// followCall is one Follow question: what it was shown.
type followCall struct {
	running, incoming int
	pending           bool
}

// TestFollow: a submission made while its key's call is in flight is put
// to Config.Follow, with that call and whether another waits behind it:
// what Follow returns is the call that goes on (then merged into the
// pending one, if any), SkipIncoming ends the submission Skipped without
// running it, another error refuses it; a submission of a newer generation
// is not asked about.
func TestFollow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var asked []followCall
		h := newHoldOne()
		errNo := errors.New("no")
		d := newD(t, h.exec, Config[string, int]{
			Workers: 1,
			Merge:   func(p, i int) (int, error) { return p*1000 + i, nil },
			Follow: func(running, incoming int, pending bool) (int, error) {
				mu.Lock()
				asked = append(asked, followCall{running, incoming, pending})
				mu.Unlock()
				switch incoming {
				case 2:
					return 0, SkipIncoming
				case 3:
					return 0, errNo
				}
				return running*100 + incoming, nil
			},
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait() // 1 is in flight

		skipped := submit(t, d, "k", 2, SubmitOptions{})
		assert.Equal(t, StateSkipped, outcome(t, skipped).State, "skipped at once")
		_, err := d.Submit(bg, "k", 3, SubmitOptions{})
		assert.ErrorIs(t, err, ErrMergeRejected)
		assert.ErrorIs(t, err, errNo)

		behind := submit(t, d, "k", 4, SubmitOptions{}) // Follow: 104, the successor
		merged := submit(t, d, "k", 5, SubmitOptions{}) // Follow: 105, merged: 104105
		newer := submit(t, d, "k", 6, SubmitOptions{Generation: 1})
		mu.Lock()
		assert.Equal(t, []followCall{{1, 2, false}, {1, 3, false}, {1, 4, false}, {1, 5, true}}, asked)
		mu.Unlock()
		h.gate.open()
		for _, tk := range []*Ticket[string, int]{first, behind, merged} {
			<-tk.Done()
		}
		<-newer.Done()
		assert.Equal(t, StateStale, outcome(t, first).State, "superseded by generation 1")
		assert.Equal(t, StateSucceeded, outcome(t, newer).State)
		assert.Equal(t, []int{1, 6}, h.values(), "skipped and refused calls never ran; the newer generation replaced the successor")
		closeD(t, d)
	})
}

// TestFollowWhileStarting: the call in flight is the core's own state, so
// Follow sees it from the moment it starts — while the worker is still
// telling earlier outcomes and the observer hears OnStart, before exec is
// entered — until its end is recorded.
func TestFollowWhileStarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inStart := make(chan struct{})
		leave := make(chan struct{})
		var once sync.Once
		obs := &startBlocker{onStart: func() {
			once.Do(func() {
				close(inStart)
				<-leave
			})
		}}
		var asked []followCall
		d := newD(t, func(context.Context, string, int) error { return nil }, Config[string, int]{
			Workers:  1,
			Observer: obs,
			Follow: func(running, incoming int, pending bool) (int, error) {
				asked = append(asked, followCall{running, incoming, pending})
				return 0, SkipIncoming
			},
		})
		first := submit(t, d, "k", 1, SubmitOptions{})
		<-inStart // taken by the worker: OnStart holds it before exec
		later := submit(t, d, "k", 2, SubmitOptions{})
		assert.Equal(t, StateSkipped, outcome(t, later).State)
		assert.Equal(t, []followCall{{1, 2, false}}, asked)
		close(leave)
		<-first.Done()
		assert.Equal(t, StateSucceeded, outcome(t, first).State)
		closeD(t, d)
	})
}

type startBlocker struct {
	NopObserver
	onStart func()
}

func (o *startBlocker) OnStart(Event, int, time.Duration) { o.onStart() }

// TestFollowPanicAndGoexit: a Follow that panics or ends its goroutine
// refuses the submission with a *PanicError, and leaves the key working.
func TestFollowPanicAndGoexit(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGate()
				d := newD(t, func(ctx context.Context, _ string, v int) error {
					if v == 1 {
						return g.wait(ctx)
					}
					return nil
				}, Config[string, int]{
					Workers: 1,
					Follow: func(_, incoming int, _ bool) (int, error) {
						if incoming == 2 {
							if how == "panic" {
								panic("boom")
							}
							runtime.Goexit()
						}
						return incoming, nil
					},
				})
				first := submit(t, d, "k", 1, SubmitOptions{})
				synctest.Wait()
				done := make(chan error, 1)
				go func() {
					var err error
					defer func() { done <- err }()
					_, err = d.Submit(bg, "k", 2, SubmitOptions{})
				}()
				err := <-done
				if how == "panic" {
					var pe *PanicError
					require.ErrorAs(t, err, &pe)
					assert.Equal(t, "follow", pe.Callback)
					assert.ErrorIs(t, err, ErrMergeRejected)
				}
				after := submit(t, d, "k", 3, SubmitOptions{})
				g.open()
				<-first.Done()
				<-after.Done()
				assert.Equal(t, StateSucceeded, outcome(t, after).State, "the key is not wedged")
				closeD(t, d)
			})
		})
	}
}

// TestGenerationSupersedes: a newer generation ends the key's older calls —
// pending waiters get Stale at once, the in-flight execution's context is
// cancelled and its late success is reported Stale — then runs after the
// old execution returns. Older generations are then refused with ErrStale.
func TestGenerationSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hooks := &hookLog[string, int]{}
		gen2 := newGate()
		var (
			mu         sync.Mutex
			order      []int
			inflight   atomic.Int32
			overlap    atomic.Bool
			execCause1 error
		)
		d := newD(t, func(ctx context.Context, _ string, call int) error {
			if inflight.Add(1) > 1 {
				overlap.Store(true)
			}
			defer inflight.Add(-1)
			mu.Lock()
			order = append(order, call)
			mu.Unlock()
			switch call {
			case 1:
				<-ctx.Done()
				mu.Lock()
				execCause1 = context.Cause(ctx)
				mu.Unlock()
				return nil // late success
			case 3:
				return gen2.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 4, OnDone: hooks.add})

		run1 := submit(t, d, "A", 1, SubmitOptions{Generation: 1})
		synctest.Wait()
		pend1 := submit(t, d, "A", 2, SubmitOptions{Generation: 1})
		require.NoError(t, d.Post("A", 2, SubmitOptions{Generation: 1}))
		new2 := submit(t, d, "A", 3, SubmitOptions{Generation: 2})
		synctest.Wait()

		for _, tk := range []*Ticket[string, int]{run1, pend1} {
			r := outcome(t, tk)
			assert.Equal(t, StateStale, r.State)
			assert.ErrorIs(t, r.Err, ErrStale)
		}
		mu.Lock()
		assert.ErrorIs(t, execCause1, ErrStale, "superseded execution's context not cancelled")
		assert.Equal(t, []int{1, 3}, order, "generation 2 runs after generation 1 returned; the superseded pending call never runs")
		mu.Unlock()

		// While generation 2 is tracked, older generations are refused.
		tk, err := d.Submit(bg, "A", 9, SubmitOptions{Generation: 1})
		assert.ErrorIs(t, err, ErrStale)
		assert.Nil(t, tk)
		assert.ErrorIs(t, d.Post("A", 9, SubmitOptions{Generation: 0}), ErrStale)
		same := submit(t, d, "A", 4, SubmitOptions{Generation: 2}) // same generation: accepted

		gen2.open()
		r, err := new2.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, 3, r.Call)
		r, err = same.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, 4, r.Call)
		synctest.Wait()
		assert.False(t, overlap.Load(), "two generations of one key ran at once")

		assert.ElementsMatch(t, []State{StateStale, StateStale, StateSucceeded, StateSucceeded}, hooks.states("A"),
			"superseded in-flight (ran, late success) and pending (never ran) calls are Stale")
		for _, hr := range hooks.of("A") {
			if hr.State == StateStale {
				assert.ErrorIs(t, hr.Err, ErrStale)
			}
		}
		s := closeD(t, d)
		assert.Equal(t, uint64(1), s.StaleExecutions)
		assert.Equal(t, uint64(2), s.Rejected)
		assert.Equal(t, map[State]int{StateStale: 3, StateSucceeded: 2}, counts(s.Outcomes))
	})
}

// TestGenerationNeverMerges: submissions of different generations are never
// merged — the merge function is not consulted across generations.
func TestGenerationNeverMerges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, string]()
		var merges []string
		d, _, release := holdWorker(t, f.exec, Config[string, string]{
			Merge: func(p, in string) (string, error) {
				merges = append(merges, p+"+"+in)
				return p + "+" + in, nil
			},
		})
		g1 := submit(t, d, "A", "a1", SubmitOptions{Generation: 1})
		g1b := submit(t, d, "A", "b1", SubmitOptions{Generation: 1})
		g2 := submit(t, d, "A", "a2", SubmitOptions{Generation: 2})
		_, err := d.Submit(bg, "A", "c1", SubmitOptions{Generation: 1})
		assert.ErrorIs(t, err, ErrStale)
		g2b := submit(t, d, "A", "b2", SubmitOptions{Generation: 2})
		assert.Equal(t, []string{"a1+b1", "a2+b2"}, merges, "merged across generations")
		release()
		assert.Equal(t, []string{"a2+b2"}, f.calls("A"))
		assert.Equal(t, map[State]int{StateStale: 2, StateSucceeded: 2}, tally(t, g1, g1b, g2, g2b))
		closeD(t, d)
	})
}

// TestGenerationForgotten: generations are remembered only while the key is
// tracked, so memory stays bounded; once the key is released, any
// generation is accepted again.
func TestGenerationForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d := newD(t, f.exec, Config[string, int]{Workers: 1})
		tk := submit(t, d, "A", 1, SubmitOptions{Generation: 5})
		_, err := tk.Wait(bg)
		require.NoError(t, err)
		synctest.Wait()
		require.False(t, d.Busy("A"))
		tk = submit(t, d, "A", 2, SubmitOptions{Generation: 1})
		_, err = tk.Wait(bg)
		require.NoError(t, err)
		closeD(t, d)
	})
}

// TestPostJoiningPosts: a Post for a key whose pending call only other
// Posts wait on is admitted as any submission is. Each case is one thing
// admission still has to decide for it, or do, and checks what it decides.
func TestPostJoiningPosts(t *testing.T) {
	// run is one execution as exec saw it: its key, value and idempotency key.
	type run struct {
		key  string
		val  int
		idem string
	}
	setup := func(t *testing.T, cfg Config[string, int]) (d *Dispatcher[string, int], ran func() []run, done *hookLog[string, int], release func()) {
		var mu sync.Mutex
		var runs []run
		done = &hookLog[string, int]{}
		cfg.OnDone = done.add
		d, _, release = holdWorker(t, func(ctx context.Context, key string, v int) error {
			mu.Lock()
			runs = append(runs, run{key, v, IdempotencyKey(ctx)})
			mu.Unlock()
			return nil
		}, cfg)
		return d, func() []run {
			mu.Lock()
			defer mu.Unlock()
			return append([]run(nil), runs...)
		}, done, release
	}
	post := func(t *testing.T, d *Dispatcher[string, int], key string, v int, o SubmitOptions) {
		t.Helper()
		require.NoError(t, d.Post(key, v, o))
	}

	t.Run("closing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, ran, _, release := setup(t, Config[string, int]{})
			post(t, d, "k", 1, SubmitOptions{})
			closed := make(chan error, 1)
			go func() { closed <- d.Close(bg) }()
			synctest.Wait()
			assert.ErrorIs(t, d.Post("k", 2, SubmitOptions{}), ErrClosed, "a Post after Close began")
			release()
			require.NoError(t, <-closed)
			assert.Equal(t, []run{{"k", 1, ""}}, ran(), "the refused Post changed nothing")
		})
	})
	t.Run("idempotency key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, ran, _, release := setup(t, Config[string, int]{})
			post(t, d, "k", 1, SubmitOptions{})
			post(t, d, "k", 2, SubmitOptions{IdempotencyKey: "x"})
			assert.ErrorIs(t, d.Post("k", 3, SubmitOptions{IdempotencyKey: "y"}), ErrMergeRejected, "another idempotency key")
			release()
			assert.Equal(t, []run{{"k", 2, "x"}}, ran(), "the call takes the key it was posted with")
			closeD(t, d)
		})
	})
	t.Run("generation", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, ran, done, release := setup(t, Config[string, int]{})
			post(t, d, "k", 1, SubmitOptions{Generation: 1})
			assert.ErrorIs(t, d.Post("k", 2, SubmitOptions{}), ErrStale, "an older generation")
			post(t, d, "k", 3, SubmitOptions{Generation: 2})
			release()
			assert.Equal(t, []run{{"k", 3, ""}}, ran(), "the newer generation superseded the call")
			assert.Equal(t, []State{StateStale, StateSucceeded}, done.states("k"))
			closeD(t, d)
		})
	})
	t.Run("follow", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var asked []followCall
			h := newHoldOne()
			d := newD(t, h.exec, Config[string, int]{Workers: 1, Follow: func(running, incoming int, pending bool) (int, error) {
				asked = append(asked, followCall{running, incoming, pending})
				return incoming + 100, nil
			}})
			post(t, d, "k", 1, SubmitOptions{})
			synctest.Wait() // 1 runs
			post(t, d, "k", 2, SubmitOptions{})
			post(t, d, "k", 3, SubmitOptions{}) // joins 2's posts, 1 still running
			h.gate.open()
			closeD(t, d)
			assert.Equal(t, []followCall{{1, 2, false}, {1, 3, true}}, asked, "Follow is asked about each Post behind the running call")
			assert.Equal(t, []int{1, 103}, h.values())
		})
	})
	t.Run("posts behind a ticket", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, done, release := setup(t, Config[string, int]{})
			tk := submit(t, d, "k", 1, SubmitOptions{})
			time.Sleep(time.Second)
			post(t, d, "k", 2, SubmitOptions{}) // the call has a ticket, no posts yet
			tk.Cancel()
			time.Sleep(time.Second)
			release()
			rs := done.of("k")
			require.Len(t, rs, 1)
			assert.Equal(t, time.Second, rs[0].QueueWait, "the call's wait counts from the Post, once the ticket left")
			closeD(t, d)
		})
	})
	t.Run("label", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _, release := setup(t, Config[string, int]{Label: func(key string, v int) string {
				if key == holdKey {
					return "hold"
				}
				return "v" + itoa(v)
			}})
			post(t, d, "k", 1, SubmitOptions{})
			post(t, d, "k", 2, SubmitOptions{Priority: 1}) // more urgent: its label
			post(t, d, "k", 3, SubmitOptions{})            // less urgent: not its label
			assert.Equal(t, map[string]int{"hold": 1, "v2": 1}, d.Stats().Labels)
			release()
			closeD(t, d)
		})
	})
	t.Run("merge", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, ran, _, release := setup(t, Config[string, int]{Merge: func(p, in int) (int, error) { return p + in, nil }})
			post(t, d, "k", 1, SubmitOptions{})
			post(t, d, "k", 2, SubmitOptions{})
			release()
			assert.Equal(t, []run{{"k", 3, ""}}, ran(), "Merge is asked")
			closeD(t, d)
		})
	})
	t.Run("tenant", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, _, _, release := setup(t, Config[string, int]{})
			post(t, d, "k", 1, SubmitOptions{Tenant: "a"})
			post(t, d, "k", 2, SubmitOptions{Tenant: "b", Priority: 1}) // more urgent: its tenant
			post(t, d, "k", 3, SubmitOptions{Tenant: "a"})              // less urgent: not its tenant
			st := d.Stats()
			assert.Equal(t, 1, st.Tenants["b"].Queued, "%+v", st.Tenants)
			assert.Zero(t, st.Tenants["a"].Queued, "%+v", st.Tenants)
			release()
			closeD(t, d)
		})
	})
	t.Run("droppable", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d, ran, done, release := setup(t, Config[string, int]{Capacity: 2})
			post(t, d, "k", 1, SubmitOptions{Droppable: true})
			post(t, d, "k", 2, SubmitOptions{}) // k may no longer be dropped
			assert.ErrorIs(t, d.Post("j", 3, prio(1)), ErrBackpressure, "at Capacity, nothing to shed")
			release()
			assert.Equal(t, []run{{"k", 2, ""}}, ran())
			assert.Equal(t, []State{StateSucceeded}, done.states("k"))
			closeD(t, d)
		})
	})
}

// TestMoot: Config.Moot is asked, under the lock, about every submission
// for a key with no call, and about no other; a moot one ends Skipped at
// once, before any bound is checked, and nothing runs; a call in flight
// or queued for the key means Moot is not asked and the submission goes on.
func TestMoot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHoldOne()
		var asked []int
		d := newD(t, h.exec, Config[string, int]{Workers: 1, Capacity: 1, Moot: func(_ string, v int) bool {
			asked = append(asked, v) // under the lock: no race
			return v%2 == 0
		}})
		require.NoError(t, d.Post("k", 2, SubmitOptions{}), "a moot Post is not refused")
		tk := submit(t, d, "k", 4, SubmitOptions{})
		select {
		case <-tk.Done():
		default:
			t.Fatal("a moot Submit's ticket is not told at once")
		}
		assert.Equal(t, StateSkipped, outcome(t, tk).State)
		s := checkConservation(t, d)
		assert.Zero(t, s.Keys, "a moot submission makes no call")
		assert.Equal(t, 2, counts(s.Outcomes)[StateSkipped])

		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()                                     // 1 runs: the key is busy, and the dispatcher full
		require.NoError(t, d.Post("k", 6, SubmitOptions{})) // not asked: behind 1
		require.NoError(t, d.Post("k", 8, SubmitOptions{})) // not asked: joins 6
		require.NoError(t, d.Post("j", 10, SubmitOptions{}), "moot before the bound")
		var be *BackpressureError
		require.ErrorAs(t, d.Post("j", 11, SubmitOptions{}), &be, "a call that is not moot meets the bound")
		h.gate.open()
		<-first.Done()
		s = closeD(t, d)
		assert.Equal(t, []int{2, 4, 1, 10, 11}, asked, "asked about the idle keys' submissions only")
		assert.Equal(t, []int{1, 8}, h.values(), "nothing moot ran")
		assert.Equal(t, 3, counts(s.Outcomes)[StateSkipped])
		assert.Equal(t, uint64(1), s.Rejected)
	})
}

// TestMootSync: in Sync mode a moot submission ends Skipped without
// running; one that is not runs inline.
func TestMootSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ran atomic.Int64
		d := newD(t, func(context.Context, string, int) error { ran.Add(1); return nil }, Config[string, int]{
			Rollout: RolloutPolicy{Mode: ModeSync},
			Moot:    func(_ string, v int) bool { return v == 0 },
		})
		require.NoError(t, d.Post("k", 0, SubmitOptions{}))
		tk := submit(t, d, "k", 0, SubmitOptions{})
		assert.Equal(t, StateSkipped, outcome(t, tk).State)
		assert.Zero(t, ran.Load())
		tk = submit(t, d, "k", 1, SubmitOptions{})
		assert.Equal(t, StateSucceeded, outcome(t, tk).State)
		assert.Equal(t, int64(1), ran.Load())
		s := closeD(t, d)
		assert.Equal(t, 2, counts(s.Outcomes)[StateSkipped])
	})
}

// TestMootPanicAndGoexit: a Moot that panics or ends its goroutine refuses
// the submission with a *PanicError, and leaves the key and the
// dispatcher working.
func TestMootPanicAndGoexit(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newD(t, nopExec, Config[string, int]{Moot: func(_ string, v int) bool {
					if v == 1 {
						if how == "panic" {
							panic("boom")
						}
						runtime.Goexit()
					}
					return false
				}})
				done := make(chan error, 1)
				go func() {
					var err error
					defer func() { done <- err }()
					_, err = d.Submit(bg, "k", 1, SubmitOptions{})
				}()
				err := <-done
				if how == "panic" {
					var pe *PanicError
					require.ErrorAs(t, err, &pe)
					assert.Equal(t, "moot", pe.Callback)
				}
				after := submit(t, d, "k", 2, SubmitOptions{})
				<-after.Done()
				assert.Equal(t, StateSucceeded, outcome(t, after).State, "the key is not wedged")
				s := closeD(t, d)
				if how == "panic" {
					assert.Equal(t, uint64(1), s.Rejected)
				}
			})
		})
	}
}
