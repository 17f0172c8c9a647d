package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tickets without a deadline or a context watch share their call's outcome
// once the call has shareMin of them (see Ticket). These tests cover what
// that must not change: every ticket hears once, Done closes whenever it
// was made, a ticket that leaves gets its own outcome, and a share survives
// the moves a call's tickets make (absorb, Sync mode, Close).

// TestShareOutcome gathers plain and watched tickets on one pending call —
// Done made before the share existed, after it, and never; one ticket
// leaving — and checks what each hears.
func TestShareOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{})
		const plain = 3 * shareMin
		var tks []*Ticket[string, int]
		var early []<-chan struct{}
		for i := range plain {
			tk := submit(t, d, "A", i, SubmitOptions{})
			if i < shareMin-1 {
				early = append(early, tk.Done()) // made before the share
			}
			tks = append(tks, tk)
		}
		late := tks[plain-1].Done() // made by a rider
		ctx, cancelCtx := context.WithCancel(bg)
		defer cancelCtx()
		watchedCtx, err := d.Submit(ctx, "A", 100, SubmitOptions{})
		require.NoError(t, err)
		watchedDl := submit(t, d, "A", 101, SubmitOptions{Deadline: time.Now().Add(time.Hour)})
		tks = append(tks, watchedCtx, watchedDl)

		// The first shareMin-1 plain tickets are visited; the later ones
		// ride the share. One of each leaves.
		leavers := map[*Ticket[string, int]]bool{tks[1]: true, tks[plain-2]: true}
		for tk := range leavers {
			tk.Cancel()
			assert.Equal(t, StateCanceled, outcome(t, tk).State, "a ticket that leaves hears at once")
		}
		for i, tk := range tks {
			if leavers[tk] {
				continue
			}
			_, ok := tk.Result()
			assert.False(t, ok, "ticket %d has an outcome before its call ran", i)
		}
		for _, ch := range append(early[2:], late) {
			select {
			case <-ch:
				t.Fatal("a Done channel closed before the call ran")
			default:
			}
		}

		release()
		var want Result[string, int]
		for i, tk := range tks {
			if leavers[tk] {
				continue
			}
			r := outcome(t, tk)
			if want.State == 0 {
				want = r
			}
			assert.Equal(t, want, r, "ticket %d heard another outcome than its call's", i)
		}
		assert.Equal(t, StateSucceeded, want.State)
		assert.Equal(t, 101, want.Call, "the call as executed")
		assert.Equal(t, plain+2, want.Waiters, "every submission the call served")
		for i, ch := range append(early, late) {
			select {
			case <-ch:
			default:
				t.Fatalf("Done channel %d made before the outcome was not closed", i)
			}
		}
		for tk := range leavers {
			assert.Equal(t, StateCanceled, outcome(t, tk).State, "a leaver keeps its own outcome")
		}
		s := closeD(t, d)
		assert.Equal(t, uint64(plain), s.Outcomes[StateSucceeded]-1, "A's tickets but the leavers")
	})
}

// TestShareAbsorbed: a running call's riders and its successor's riders
// end as one when the call's retry absorbs the successor — including
// tickets whose Done channel was registered with the successor's share,
// which is never told.
func TestShareAbsorbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, s, release := retryOnce(t)
		var first, second []*Ticket[string, int]
		for i := range shareMin + 1 {
			first = append(first, submit(t, d, "k", 1+i, SubmitOptions{}))
		}
		synctest.Wait() // in flight
		var dones []<-chan struct{}
		for i := range shareMin + 2 {
			tk := submit(t, d, "k", 10+i, SubmitOptions{}) // successors
			dones = append(dones, tk.Done())
			second = append(second, tk)
		}
		second[0].Cancel()
		close(release)
		for _, ch := range dones {
			<-ch // a channel never closed deadlocks the bubble: synctest fails the test
		}
		assert.Equal(t, StateCanceled, outcome(t, second[0]).State)
		for i, tk := range append(first, second[1:]...) {
			r := outcome(t, tk)
			assert.Equal(t, StateSucceeded, r.State, "ticket %d", i)
			assert.Equal(t, 10+shareMin+1, r.Call, "ticket %d: the retry ran the successor's value", i)
		}
		assert.Equal(t, 2, int(s.calls.Load()), "one retry served both")
		closeD(t, d)
	})
}

// TestShareSync: Sync-mode submitters that coalesce into one call, enough
// to share its outcome, each return with it: one of them runs the call
// inline, and the others' wait ends on the share (runInlineUnlock).
func TestShareSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		d := newD(t, func(ctx context.Context, _ string, v int) error {
			if v == 0 {
				return g.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 1})
		require.NoError(t, d.SetMode(bg, ModeSync))
		var wg sync.WaitGroup
		wg.Go(func() { assert.Equal(t, StateSucceeded, outcome(t, submit(t, d, "A", 0, SubmitOptions{})).State) })
		synctest.Wait() // "A" 0 runs inline, and blocks
		res := make([]Result[string, int], 2*shareMin)
		for i := range res {
			wg.Go(func() {
				tk := submit(t, d, "A", i+1, SubmitOptions{}) // the successor's tickets
				res[i] = outcome(t, tk)
			})
		}
		synctest.Wait()
		assert.Equal(t, 2*shareMin+1, d.Stats().Tickets, "the successor's tickets wait for it")
		g.open()
		wg.Wait()
		for i, r := range res {
			assert.Equal(t, StateSucceeded, r.State, "submitter %d", i)
			assert.Equal(t, 2*shareMin, r.Waiters, "submitter %d", i)
		}
		closeD(t, d)
	})
}

// TestShareClose: Close ends a queued call's riders Closed, and a ticket
// that asks for Done afterwards finds it closed.
func TestShareClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, hold, _ := holdWorker(t, nopExec, Config[string, int]{})
		var tks []*Ticket[string, int]
		for i := range 2 * shareMin {
			tks = append(tks, submit(t, d, "A", i, SubmitOptions{}))
		}
		w := tks[0].Done()
		ctx, cancel := context.WithCancel(bg)
		cancel() // no drain: everything left ends Closed
		require.Error(t, d.Close(ctx))
		<-w
		for i, tk := range tks {
			assert.Equal(t, StateClosed, outcome(t, tk).State, "ticket %d", i)
		}
		outcome(t, hold)
		checkConservation(t, d)
	})
}

// TestShareRace has submitters, waiters, cancellers and a slow worker race
// on a few keys, so that tickets board shares, make Done channels and
// leave while calls end. Every ticket must hear exactly once (a second
// close of Done would panic), Result must agree with Done, and the counts
// must balance. Run it under -race.
func TestShareRace(t *testing.T) {
	d, err := New(func(context.Context, string, int) error { return nil }, Config[string, int]{Workers: 2})
	require.NoError(t, err)
	const submitters, perSubmitter = 8, 2000
	var wg sync.WaitGroup
	tickets := make([][]*Ticket[string, int], submitters)
	for g := range submitters {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range perSubmitter {
				tk, err := d.Submit(bg, itoa(r.IntN(3)), i, SubmitOptions{Priority: r.IntN(3)})
				if !assert.NoError(t, err) {
					return
				}
				tickets[g] = append(tickets[g], tk)
				switch r.IntN(8) {
				case 0:
					tk.Cancel()
				case 1:
					wg.Go(func() {
						done := tk.Done()
						if r, ok := tk.Result(); ok {
							select {
							case <-done:
							default:
								t.Errorf("Result is %v, but a Done channel made before is open", r.State)
							}
						}
						<-done
					})
				case 2:
					wg.Go(func() { _, _ = tk.Wait(bg) })
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, d.Close(bg))
	n := 0
	for _, ts := range tickets {
		for _, tk := range ts {
			outcome(t, tk)
			n++
		}
	}
	s := checkConservation(t, d)
	assert.Equal(t, uint64(n), total(s.Outcomes))
	assert.Zero(t, s.Tickets)
}

// TestDoneAgreesWithResult: a Done channel handed out before the outcome
// is closed by the time Result reports it, and a waiter that Done wakes
// finds the outcome. Watchers spin on Result, and waiters block on Done,
// while a worker tells their tickets — the running call's lone ticket, and
// its successor's visited tickets and riders — so that they land between
// the telling's steps whichever order those come in. Run it under -race.
func TestDoneAgreesWithResult(t *testing.T) {
	const rounds = 200
	gates := make([]chan struct{}, rounds) // the call value is its round
	for i := range gates {
		gates[i] = make(chan struct{})
	}
	d := newD(t, func(_ context.Context, _ string, round int) error { <-gates[round]; return nil },
		Config[string, int]{Workers: 1})
	for round := range rounds {
		var ready, watchers sync.WaitGroup
		for range 2*shareMin + 1 {
			tk := submit(t, d, "k", round, SubmitOptions{})
			ready.Add(1)
			watchers.Go(func() {
				done := tk.Done()
				ready.Done()
				for {
					if r, ok := tk.Result(); ok {
						select {
						case <-done:
						default:
							t.Errorf("round %d: Result is %v, but the Done channel made before is open", round, r.State)
						}
						return
					}
					runtime.Gosched()
				}
			})
			ready.Add(1)
			watchers.Go(func() {
				done := tk.Done()
				ready.Done()
				for { // polls, so as to see the channel the moment it closes
					select {
					case <-done:
						if _, ok := tk.Result(); !ok {
							t.Errorf("round %d: Done is closed, but Result reports no outcome", round)
						}
						_, _ = tk.Wait(bg) // returns at once, with the outcome
						return
					default:
						runtime.Gosched()
					}
				}
			})
		}
		ready.Wait()
		close(gates[round]) // the running call, if one started, and what waits behind it
		watchers.Wait()
	}
	closeD(t, d)
}

// TestTicket exercises the Ticket API: Done and Result before and after
// the outcome, Wait with a context that ends first (the submission stays
// live), and Cancel after the outcome (a no-op).
func TestTicket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		g := f.block("k")
		d := newD(t, f.exec, Config[string, int]{Workers: 1})
		tk := submit(t, d, "k", 7, prio(0))
		synctest.Wait()

		select {
		case <-tk.Done():
			t.Fatal("Done closed before the outcome")
		default:
		}
		r, ok := tk.Result()
		assert.False(t, ok)
		assert.Zero(t, r)

		ctx, cancel := context.WithTimeout(bg, time.Second)
		start := time.Now()
		r, err := tk.Wait(ctx)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Zero(t, r)
		assert.Equal(t, time.Second, time.Since(start))

		done, cancelDone := context.WithCancel(bg)
		cancelDone()
		_, err = tk.Wait(done)
		assert.ErrorIs(t, err, context.Canceled)

		// Still live: Wait's context is not the submission's.
		s := checkConservation(t, d)
		assert.Equal(t, 1, s.Live)
		assert.Equal(t, 1, s.Tickets)
		assert.True(t, d.Busy("k"))

		g.open()
		r, err = tk.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, Result[string, int]{Key: "k", Call: 7, Outcome: Outcome{
			State: StateSucceeded, Attempts: 1, Waiters: 1, QueueWait: 0, RunTime: time.Second,
		}}, r)
		before := checkConservation(t, d)
		tk.Cancel()
		tk.Cancel()
		after := checkConservation(t, d)
		assert.Equal(t, before, after, "Cancel after the outcome changed the dispatcher")
		assert.Equal(t, r, outcome(t, tk))
		closeD(t, d)
	})
}

// TestTicketDoneLazy: a ticket's Done channel is made when first asked for,
// is the same channel on every call, and is closed when the outcome is
// told; asked for only after the outcome, it is already closed. Callers
// racing Done, Wait and Result against the delivery all see the outcome.
func TestTicketDoneLazy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, early, release := holdWorker(t, f.exec, Config[string, int]{}) // early: the held call's ticket
		ch := early.Done()
		assert.Equal(t, ch, early.Done(), "Done made a second channel")
		select {
		case <-ch:
			t.Fatal("Done closed before the outcome")
		default:
		}

		late := submit(t, d, "b", 2, prio(0)) // runs after the held call; nobody asks for Done before it ends
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-early.Done()
				r, ok := early.Result()
				assert.True(t, ok)
				assert.Equal(t, StateSucceeded, r.State)
			})
		}
		release()
		wg.Wait()
		<-ch

		r, ok := late.Result()
		require.True(t, ok, "outcome told without anyone asking for Done")
		assert.Equal(t, StateSucceeded, r.State)
		select {
		case <-late.Done():
		default:
			t.Fatal("Done asked for after the outcome is not closed")
		}
		closeD(t, d)
	})
}

// TestTicketDoneConcurrent races the first Done calls of many tickets
// against their delivery by several workers, under -race: every caller's
// channel closes and every Result is there once it has.
func TestTicketDoneConcurrent(t *testing.T) {
	d := newD(t, nopExec, Config[string, int]{Workers: 4})
	const n = 2000
	tks := make([]*Ticket[string, int], n)
	for i := range tks {
		tks[i] = submit(t, d, fmt.Sprint(i), i, prio(0))
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				<-tks[i].Done()
				_, ok := tks[i].Result()
				assert.True(t, ok)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, map[State]int{StateSucceeded: n}, tally(t, tks...))
	closeD(t, d)
}
