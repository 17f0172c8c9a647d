package dispatch

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		var ran []int
		g := newGate()
		errNo := errors.New("no")
		d := newD(t, func(ctx context.Context, _ string, v int) error {
			mu.Lock()
			ran = append(ran, v)
			mu.Unlock()
			if v == 1 {
				return g.wait(ctx)
			}
			return nil
		}, Config[string, int]{
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
		g.open()
		for _, tk := range []*Ticket[string, int]{first, behind, merged} {
			<-tk.Done()
		}
		<-newer.Done()
		assert.Equal(t, StateStale, outcome(t, first).State, "superseded by generation 1")
		assert.Equal(t, StateSucceeded, outcome(t, newer).State)
		mu.Lock()
		assert.Equal(t, []int{1, 6}, ran, "skipped and refused calls never ran; the newer generation replaced the successor")
		mu.Unlock()
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

// TestAmendNewest: AmendNewest shows the pending call, or, when none is
// pending, the call in flight (never rewritten), and whether a call is in
// flight; a no-op found while a call is in flight is not dropped (that
// call may change what it was judged against), neither through Amend.
func TestAmendNewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		var mu sync.Mutex
		var ran []int
		d := newD(t, func(ctx context.Context, _ string, v int) error {
			mu.Lock()
			ran = append(ran, v)
			mu.Unlock()
			if v == 1 {
				return g.wait(ctx)
			}
			return nil
		}, Config[string, int]{
			Workers: 1,
			NoOp:    func(_ string, v int) bool { return v == 0 },
		})
		found, err := d.AmendNewest("none", func(int, bool) (int, error) { panic("not called") })
		require.NoError(t, err)
		assert.False(t, found)

		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait() // in flight, nothing pending
		var seen []followCall
		found, err = d.AmendNewest("k", func(v int, inFlight bool) (int, error) {
			seen = append(seen, followCall{running: v, pending: inFlight})
			return 99, nil // dropped: a call in flight is never rewritten
		})
		require.NoError(t, err)
		assert.True(t, found)

		behind := submit(t, d, "k", 2, SubmitOptions{})
		found, err = d.AmendNewest("k", func(v int, inFlight bool) (int, error) {
			seen = append(seen, followCall{running: v, pending: inFlight})
			return 0, nil // a no-op, judged while 1 is in flight: kept
		})
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, []followCall{{running: 1, pending: true}, {running: 2, pending: true}}, seen)
		found, err = d.Amend("k", func(int) (int, error) { return 0, nil })
		require.NoError(t, err)
		assert.True(t, found)
		_, done := behind.Result()
		assert.False(t, done, "a no-op judged while a call is in flight is not dropped")

		g.open()
		<-first.Done()
		<-behind.Done()
		assert.Equal(t, StateSucceeded, outcome(t, first).State)
		assert.Equal(t, StateSkipped, outcome(t, behind).State, "its own test, before it starts, decides")
		mu.Lock()
		assert.Equal(t, []int{1}, ran, "1 ran as submitted")
		mu.Unlock()

		// Nothing in flight: a no-op rewrite drops the pending call at once.
		h := newGate()
		d2 := newD(t, func(ctx context.Context, k string, _ int) error {
			if k == "hold" {
				return h.wait(ctx)
			}
			return nil
		}, Config[string, int]{Workers: 1, NoOp: func(_ string, v int) bool { return v == 0 }})
		submit(t, d2, "hold", 1, SubmitOptions{})
		synctest.Wait()
		queued := submit(t, d2, "q", 5, SubmitOptions{})
		found, err = d2.AmendNewest("q", func(v int, inFlight bool) (int, error) {
			assert.False(t, inFlight)
			return 0, nil
		})
		require.NoError(t, err)
		assert.True(t, found)
		assert.Equal(t, StateSkipped, outcome(t, queued).State)
		h.open()
		closeD(t, d)
		closeD(t, d2)
	})
}
