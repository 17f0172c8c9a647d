package dispatch

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --- deadlines ---

// TestWaiterDeadlines: each waiter of one call has its own deadline, from
// its context or SubmitOptions.Deadline, whichever is earlier; it ends
// Expired at that moment while the call goes on and succeeds for the
// others.
func TestWaiterDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		now := time.Now()
		withTimeout := func(dl time.Duration) context.Context {
			ctx, cancel := context.WithTimeout(bg, dl)
			t.Cleanup(cancel)
			return ctx
		}
		type waiter struct {
			name string
			ctx  context.Context
			opts SubmitOptions
			want State
			at   time.Duration // when Done closes
		}
		ws := []waiter{
			{"no deadline", bg, SubmitOptions{}, StateSucceeded, 10 * time.Second},
			{"ctx 1s", withTimeout(time.Second), SubmitOptions{}, StateExpired, time.Second},
			{"opts 2s, ctx 5s", withTimeout(5 * time.Second), SubmitOptions{Deadline: now.Add(2 * time.Second)}, StateExpired, 2 * time.Second},
			{"opts 5s, ctx 1.5s", withTimeout(1500 * time.Millisecond), SubmitOptions{Deadline: now.Add(5 * time.Second)}, StateExpired, 1500 * time.Millisecond},
			{"opts 3s", bg, SubmitOptions{Deadline: now.Add(3 * time.Second)}, StateExpired, 3 * time.Second},
			{"opts 20s", bg, SubmitOptions{Deadline: now.Add(20 * time.Second)}, StateSucceeded, 10 * time.Second},
			{"ctx 30s", withTimeout(30 * time.Second), SubmitOptions{}, StateSucceeded, 10 * time.Second},
		}
		var tks []*Ticket[string, int]
		for _, w := range ws {
			tk, err := d.Submit(w.ctx, "A", 0, SubmitOptions{Deadline: w.opts.Deadline})
			require.NoError(t, err, w.name)
			tks = append(tks, tk)
		}
		times := watchDone(tks...)
		time.Sleep(10 * time.Second)
		s := checkConservation(t, d)
		assert.Equal(t, uint64(4), s.Outcomes[StateExpired], "expired while the call waits")
		assert.Equal(t, 4, s.Live) // hold + three waiters of A
		assert.True(t, d.Busy("A"), "the call goes on for its other waiters")
		release()
		for i, w := range ws {
			r := outcome(t, tks[i])
			assert.Equal(t, w.want, r.State, w.name)
			at, ok := times.of(tks[i])
			assert.True(t, ok, w.name)
			assert.Equal(t, w.at, at, w.name)
		}
		assert.Equal(t, []int{0}, f.calls("A"), "one execution")
		closeD(t, d)
	})
}

// TestExtremeDeadlines: deadlines at the edges of the clock — a nanosecond
// ahead, or centuries ahead — neither overflow nor misfire.
func TestExtremeDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		d, _, release := holdWorker(t, f.exec, Config[string, int]{})
		now := time.Now()
		soon := submit(t, d, "soon", 0, SubmitOptions{Deadline: now.Add(time.Nanosecond)})
		far := []time.Time{
			now.Add(time.Duration(1<<63 - 1)),
			time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
			time.Unix(1<<62, 0),
		}
		var tks []*Ticket[string, int]
		for i, dl := range far {
			key := "far" + itoa(i)
			tks = append(tks, submit(t, d, key, 0, SubmitOptions{Deadline: dl}))
			require.NoError(t, d.Post(key, 0, SubmitOptions{Deadline: dl}))
			ctx, cancel := context.WithDeadline(bg, dl)
			t.Cleanup(cancel)
			tk, err := d.Submit(ctx, key, 0, SubmitOptions{})
			require.NoError(t, err)
			tks = append(tks, tk)
		}
		time.Sleep(time.Millisecond)
		assert.Equal(t, StateExpired, outcome(t, soon).State)
		time.Sleep(24 * time.Hour)
		release()
		assert.Equal(t, map[State]int{StateSucceeded: len(tks)}, tally(t, tks...))
		assert.Equal(t, []string{"far0", "far1", "far2"}, f.keys())
		closeD(t, d)
	})
}

// TestTimeout: SubmitOptions.Timeout is a deadline that long after the
// submission, for Submit and Post alike. With Deadline or the context's
// deadline too, the earliest holds; at its extremes it neither overflows
// nor misfires; a negative one is refused, naming the field, and nothing
// is queued, in either mode.
func TestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture[string, int]()
		hooks := &hookLog[string, int]{}
		d, _, release := holdWorker(t, f.exec, Config[string, int]{OnDone: hooks.add})
		now := time.Now()
		ctx5, cancel := context.WithTimeout(bg, 5*time.Second)
		defer cancel()
		const never = 10 * time.Second // the worker is let go then
		cases := []struct {
			name string
			ctx  context.Context // the Submit's; a Post has none
			o    SubmitOptions
			at   time.Duration // when the Submit's ticket expires, or never
			post time.Duration // when the Post's call expires, or never
		}{
			{"1ns", bg, SubmitOptions{Timeout: time.Nanosecond}, time.Nanosecond, time.Nanosecond},
			{"3s, deadline 1s", bg, SubmitOptions{Timeout: 3 * time.Second, Deadline: now.Add(time.Second)}, time.Second, time.Second},
			{"1.5s, deadline 4s", bg, SubmitOptions{Timeout: 1500 * time.Millisecond, Deadline: now.Add(4 * time.Second)}, 1500 * time.Millisecond, 1500 * time.Millisecond},
			{"2s", bg, SubmitOptions{Timeout: 2 * time.Second}, 2 * time.Second, 2 * time.Second},
			{"4s, ctx 5s", ctx5, SubmitOptions{Timeout: 4 * time.Second}, 4 * time.Second, 4 * time.Second},
			{"6s, ctx 5s", ctx5, SubmitOptions{Timeout: 6 * time.Second}, 5 * time.Second, 6 * time.Second},
			{"20s", bg, SubmitOptions{Timeout: 20 * time.Second}, never, never},
			{"max", bg, SubmitOptions{Timeout: math.MaxInt64}, never, never},
			{"max, deadline far", bg, SubmitOptions{Timeout: math.MaxInt64, Deadline: time.Unix(1<<62, 0)}, never, never},
		}
		var tks []*Ticket[string, int]
		for _, c := range cases {
			tk, err := d.Submit(c.ctx, "s "+c.name, 0, c.o)
			require.NoError(t, err, c.name)
			tks = append(tks, tk)
			require.NoError(t, d.Post("p "+c.name, 0, c.o), c.name)
		}
		times := watchDone(tks...)
		// Each Post's call is queued until just before its deadline and
		// gone just after it (the cases are in order of it).
		for _, c := range cases {
			if c.post == never {
				continue
			}
			if c.post > time.Millisecond {
				time.Sleep(c.post - time.Millisecond - time.Since(now))
				assert.True(t, d.Busy("p "+c.name), "%s: ended before its deadline", c.name)
			}
			time.Sleep(c.post + time.Millisecond - time.Since(now))
			assert.False(t, d.Busy("p "+c.name), "%s: still queued after its deadline", c.name)
			assert.Equal(t, []State{StateExpired}, hooks.states("p "+c.name), c.name)
		}
		time.Sleep(never - time.Since(now))

		for _, post := range []bool{false, true} {
			var err error
			if post {
				err = d.Post("negative", 0, SubmitOptions{Timeout: -time.Nanosecond, Deadline: now.Add(time.Hour)})
			} else {
				_, err = d.Submit(bg, "negative", 0, SubmitOptions{Timeout: -time.Hour})
			}
			require.ErrorIs(t, err, ErrExpired)
			assert.Contains(t, err.Error(), "SubmitOptions.Timeout")
			assert.False(t, d.Busy("negative"), "nothing queued")
		}
		release()
		for i, c := range cases {
			want := StateExpired
			if c.at == never {
				want = StateSucceeded
			}
			assert.Equal(t, want, outcome(t, tks[i]).State, c.name)
			at, ok := times.of(tks[i])
			assert.True(t, ok, c.name)
			assert.Equal(t, c.at, at, c.name)
			if c.post == never {
				assert.Equal(t, []State{StateSucceeded}, hooks.states("p "+c.name), c.name)
			}
		}
		s := checkConservation(t, d)
		assert.Equal(t, uint64(2), s.Rejected)

		require.NoError(t, d.SetMode(bg, ModeSync))
		require.ErrorIs(t, d.Post("negative", 0, SubmitOptions{Timeout: -1}), ErrExpired)
		require.NoError(t, d.Post("sync", 0, SubmitOptions{Timeout: time.Hour}))
		tk, err := d.Submit(bg, "sync", 1, SubmitOptions{Timeout: math.MaxInt64})
		require.NoError(t, err)
		assert.Equal(t, StateSucceeded, outcome(t, tk).State)
		assert.Equal(t, []int{0, 1}, f.calls("sync"))
		s = closeD(t, d)
		assert.Equal(t, uint64(3), s.Rejected)
	})
}

// TestDeadlineWhileInFlight: a waiter whose deadline passes while the call
// runs ends Expired at its deadline without disturbing the execution; when
// every waiter has expired, the execution context ends (it carries the
// latest deadline) and the late result is reported Stale.
func TestDeadlineWhileInFlight(t *testing.T) {
	t.Run("one of two expires", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ctxEnded atomic.Bool
			d, _, release := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
				time.Sleep(5 * time.Second)
				ctxEnded.Store(ctx.Err() != nil)
				return nil
			}, Config[string, int]{})
			short := submit(t, d, "A", 0, SubmitOptions{Deadline: time.Now().Add(2 * time.Second)})
			long := submit(t, d, "A", 0, SubmitOptions{})
			times := watchDone(short, long)
			release()
			waitAll(short, long)
			synctest.Wait() // let the watchers record
			assert.Equal(t, StateExpired, outcome(t, short).State)
			assert.Equal(t, StateSucceeded, outcome(t, long).State)
			at, _ := times.of(short)
			assert.Equal(t, 2*time.Second, at, "expired at its own deadline")
			at, _ = times.of(long)
			assert.Equal(t, 5*time.Second, at)
			assert.False(t, ctxEnded.Load(), "execution context ended although a waiter had no deadline")
			s := closeD(t, d)
			assert.Zero(t, s.StaleExecutions)
		})
	})
	t.Run("all expire", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hooks := &hookLog[string, int]{}
			var sawDone atomic.Bool
			d, _, release := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
				select {
				case <-ctx.Done():
					sawDone.Store(true)
					return nil // a late success
				case <-time.After(time.Minute):
					return nil
				}
			}, Config[string, int]{OnDone: hooks.add})
			start := time.Now()
			a := submit(t, d, "A", 0, SubmitOptions{Deadline: start.Add(2 * time.Second)})
			b := submit(t, d, "A", 0, SubmitOptions{Deadline: start.Add(3 * time.Second)})
			release()
			waitAll(a, b)
			synctest.Wait()
			assert.Equal(t, map[State]int{StateExpired: 2}, tally(t, a, b))
			assert.True(t, sawDone.Load(), "execution context not ended when the last waiter expired")
			assert.Equal(t, 3*time.Second, time.Since(start))
			assert.Equal(t, []State{StateStale}, hooks.states("A"), "a result after every waiter expired must be Stale")
			s := closeD(t, d)
			assert.Equal(t, uint64(1), s.StaleExecutions)
			assert.Equal(t, uint64(1), s.Outcomes[StateSucceeded]) // hold
		})
	})
}

// --- the last waiter leaving ---

// TestLastWaiterLeaves: when the last waiter of an in-flight call leaves,
// the execution context is cancelled and the execution is reported Stale
// (also when exec ignores that and returns success); when the last waiter
// of a pending call leaves, the call is removed and never runs.
func TestLastWaiterLeaves(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := "in flight, exec honours ctx"
		if late {
			name = "in flight, exec returns success late"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hooks := &hookLog[string, int]{}
				lateReturn := newGate()
				var cause atomic.Value
				d, _, releaseHold := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
					<-ctx.Done()
					cause.Store(context.Cause(ctx))
					if late {
						_ = lateReturn.wait(context.Background())
						return nil
					}
					return ctx.Err()
				}, Config[string, int]{OnDone: hooks.add})
				ctx, cancel := context.WithCancel(bg)
				t1, err := d.Submit(ctx, "A", 0, prio(0))
				require.NoError(t, err)
				t2 := submit(t, d, "A", 0, prio(0)) // joins t1's pending call
				releaseHold()
				s := checkConservation(t, d)
				require.Equal(t, 1, s.InFlight)
				require.Zero(t, s.Successors)

				t2.Cancel()
				synctest.Wait()
				assert.Nil(t, cause.Load(), "exec context cancelled while a waiter remained")
				assert.Equal(t, StateCanceled, outcome(t, t2).State)

				cancel() // the last waiter leaves
				synctest.Wait()
				require.NotNil(t, cause.Load(), "exec context not cancelled when the last waiter left")
				assert.ErrorIs(t, cause.Load().(error), ErrCanceled)
				r := outcome(t, t1)
				assert.Equal(t, StateCanceled, r.State)
				assert.ErrorIs(t, r.Err, context.Canceled)
				if late {
					assert.True(t, d.Busy("A"), "an orphaned execution that has not returned may still take effect")
					lateReturn.open()
					synctest.Wait()
				}
				assert.False(t, d.Busy("A"))
				assert.Equal(t, []State{StateStale}, hooks.states("A"))
				s = closeD(t, d)
				assert.Equal(t, uint64(1), s.StaleExecutions)
				assert.Equal(t, map[State]int{StateStale: 1, StateSucceeded: 1}, counts(s.Calls))
				assert.Equal(t, map[State]int{StateCanceled: 2, StateSucceeded: 1}, counts(s.Outcomes))
			})
		})
	}
	t.Run("pending", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFixture[string, int]()
			hooks := &hookLog[string, int]{}
			d, _, release := holdWorker(t, f.exec, Config[string, int]{OnDone: hooks.add})
			ctx, cancel := context.WithCancel(bg)
			a1, err := d.Submit(ctx, "A", 0, prio(0))
			require.NoError(t, err)
			a2 := submit(t, d, "A", 0, SubmitOptions{Deadline: time.Now().Add(time.Second)})
			a3 := submit(t, d, "A", 0, prio(0))
			a3.Cancel()
			cancel()
			assert.True(t, d.Busy("A"))
			time.Sleep(2 * time.Second) // a2 expires: the last one
			assert.False(t, d.Busy("A"), "a pending call without waiters was not removed")
			s := checkConservation(t, d)
			assert.Equal(t, 1, s.Keys)
			assert.Zero(t, s.Ready)
			assert.Equal(t, []State{StateExpired}, hooks.states("A"))
			release()
			assert.Empty(t, f.keys(), "a call without waiters ran")
			assert.Equal(t, map[State]int{StateCanceled: 2, StateExpired: 1}, tally(t, a1, a2, a3))
			closeD(t, d)
		})
	})
}

// TestCountsPast32Bits: a call keeps its counts of posts and of the
// submissions it served in 32 bits each and carries what passes 2³²−1 into
// its rare part. Counts past 2³² survive a retry absorbing the call, and
// reach Result.Waiters and Stats exactly.
func TestCountsPast32Bits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, s, release := retryOnce(t)
		first := submit(t, d, "k", 1, SubmitOptions{})
		synctest.Wait()                                     // in flight
		require.NoError(t, d.Post("k", 2, SubmitOptions{})) // the successor's first post

		// Stand in for 2³²−2 more posts: the successor's counts, and the
		// dispatcher's, as if each had been posted.
		const more = math.MaxUint32 - 2
		d.mu.Lock()
		n := d.lanes.lookup("k").pending
		n.nPosts += more
		n.joined += more
		d.waiters.posts += more
		d.totals.submitted += more
		d.totals.coalesced += more
		n.tag.ten.st.Admitted += more
		d.mu.Unlock()

		for range 3 {
			require.NoError(t, d.Post("k", 2, SubmitOptions{}))
		}
		second := submit(t, d, "k", 2, SubmitOptions{})
		const posts = 1 + more + 3 // 2³² + 2
		d.mu.Lock()
		lo, joined, rare := n.nPosts, n.joined, n.rare
		count, served := n.postCount(), n.joinedCount()
		d.mu.Unlock()
		// The second of the three posts passed 2³²−1: 32 bits kept 2³¹,
		// and counted on from there.
		assert.EqualValues(t, 1<<31+1, lo)
		require.NotNil(t, rare)
		assert.Equal(t, posts, count)
		assert.Equal(t, posts+1, served, "the posts and the ticket")
		assert.EqualValues(t, 1<<31+2, joined)
		assert.Equal(t, posts, d.Stats().Live-2, "Live counts the posts and both tickets")

		close(release) // the first attempt fails; its retry absorbs the successor
		r1, err := first.Wait(bg)
		require.NoError(t, err)
		r2, err := second.Wait(bg)
		require.NoError(t, err)
		assert.Equal(t, []int{1, 2}, s.vals, "one retry served them all")
		assert.Equal(t, posts+2, r1.Waiters, "every submission the retry served")
		assert.Equal(t, r1.Waiters, r2.Waiters)
		st := closeD(t, d)
		assert.EqualValues(t, posts+2, st.Outcomes[StateSucceeded])
		assert.Zero(t, st.Live)
	})
}

// TestJoinShortCase: join's short case for a hot key written again leaves
// the call as joinAny, the whole of it, would. Each case is one of the
// things that send a submission the whole way; the short case itself is
// the first.
func TestJoinShortCase(t *testing.T) {
	type print struct {
		prio           int
		enq            int64
		posts, joined  int
		postsPrio      int
		postsEnq       int64
		deadline, at   int64
		forever, apart bool
		first          string // the key that runs first
	}
	type join struct {
		prio       int
		now, dline int64
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, d *Dispatcher[string, int])
		join  func(d *Dispatcher[string, int], c *call[string, int]) join
		want  func(t *testing.T, p print, enq int64)
	}{
		{
			name:  "nothing to decide",
			setup: func(t *testing.T, d *Dispatcher[string, int]) { require.NoError(t, d.Post("k", 1, prio(3))) },
			join:  func(_ *Dispatcher[string, int], c *call[string, int]) join { return join{2, c.enq + 1, 0} },
			want: func(t *testing.T, p print, enq int64) {
				assert.Equal(t, print{prio: 3, enq: enq, posts: 2, joined: 2, postsPrio: 3, postsEnq: enq, forever: true, first: "other"}, p)
			},
		},
		{
			name:  "more urgent",
			setup: func(t *testing.T, d *Dispatcher[string, int]) { require.NoError(t, d.Post("k", 1, prio(3))) },
			join:  func(_ *Dispatcher[string, int], c *call[string, int]) join { return join{5, c.enq, 0} },
			want: func(t *testing.T, p print, _ int64) {
				assert.Equal(t, 5, p.prio, "the call's priority is raised")
				assert.Equal(t, "k", p.first, "and it moves ahead of the other key")
			},
		},
		{
			name:  "earlier",
			setup: func(t *testing.T, d *Dispatcher[string, int]) { require.NoError(t, d.Post("k", 1, prio(3))) },
			join:  func(_ *Dispatcher[string, int], c *call[string, int]) join { return join{3, c.enq - 1, 0} },
			want: func(t *testing.T, p print, enq int64) {
				assert.Equal(t, enq-1, p.enq, "the call's enqueue time is the earliest")
			},
		},
		{
			// Short too: the posts never expire, whatever its deadline.
			name:  "with a deadline",
			setup: func(t *testing.T, d *Dispatcher[string, int]) { require.NoError(t, d.Post("k", 1, prio(3))) },
			join: func(d *Dispatcher[string, int], c *call[string, int]) join {
				return join{3, c.enq, d.clk.at(time.Now().Add(time.Hour))}
			},
			want: func(t *testing.T, p print, enq int64) {
				assert.Equal(t, print{prio: 3, enq: enq, posts: 2, joined: 2, postsPrio: 3, postsEnq: enq, forever: true, first: "other"}, p)
			},
		},
		{
			name: "posts that expire",
			setup: func(t *testing.T, d *Dispatcher[string, int]) {
				require.NoError(t, d.Post("k", 1, SubmitOptions{Priority: 3, Deadline: time.Now().Add(time.Minute)}))
			},
			join: func(_ *Dispatcher[string, int], c *call[string, int]) join { return join{3, c.enq, 0} },
			want: func(t *testing.T, p print, _ int64) {
				assert.True(t, p.forever, "a post without a deadline: the posts never expire")
				assert.Zero(t, p.at, "and leave the deadline index")
			},
		},
		{
			name: "posts apart from a ticket",
			setup: func(t *testing.T, d *Dispatcher[string, int]) {
				require.NoError(t, d.Post("k", 1, prio(1)))
				submit(t, d, "k", 2, prio(5))
			},
			join: func(_ *Dispatcher[string, int], c *call[string, int]) join { return join{3, c.enq, 0} },
			want: func(t *testing.T, p print, _ int64) {
				assert.Equal(t, 5, p.prio, "the ticket's priority is the call's")
				assert.Equal(t, 3, p.postsPrio, "the posts' own is raised")
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var prints [2]print
				var enq int64
				for i, short := range []bool{true, false} {
					d, _, release := holdWorker(t, nopExec, Config[string, int]{})
					require.NoError(t, d.Post("other", 0, prio(4)))
					tc.setup(t, d)
					d.mu.Lock()
					c := d.lanes.lookup("k").pending
					enq = c.enq
					j := tc.join(d, c)
					if short {
						d.waiters.join(&d.q, c, nil, j.prio, j.now, j.dline)
					} else {
						d.waiters.joinAny(&d.q, c, nil, j.prio, j.now, j.dline)
					}
					d.tenants.count(c.tag.ten, nil, &d.totals) // as Post counts it
					pp, pe := c.postsOrder()
					prints[i] = print{
						prio: c.prio, enq: c.enq, posts: c.postCount(), joined: c.joinedCount(),
						postsPrio: pp, postsEnq: pe, deadline: c.posts.deadline, at: c.posts.at,
						forever: c.is(fPostsForever), apart: c.is(fPostsApart),
						first: c.tag.ten.ready.min().c.lane.key,
					}
					if p := &prints[i]; p.forever {
						p.deadline = 0 // read by nothing while a post has none
					}
					d.mu.Unlock()
					release()
					closeD(t, d)
				}
				assert.Equal(t, prints[1], prints[0], "join and joinAny")
				tc.want(t, prints[0], enq)
			})
		})
	}
}
