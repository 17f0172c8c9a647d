package dispatch

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOnDone: the completion hook fires exactly once per finished call —
// succeeded, failed or removed — with Waiters counting every coalesced
// submission, after the call's waiters have been told, outside every lock
// (it may call the Dispatcher), with the call's timings.
func TestOnDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			tickets = map[string][]*Ticket[string, int]{}
			results []Result[string, int]
			bad     []string
			d       *Dispatcher[string, int]
		)
		hook := func(r Result[string, int]) {
			st := d.Stats() // deadlocks if the hook runs under the lock
			_ = d.Busy(r.Key)
			mu.Lock()
			defer mu.Unlock()
			if total(st.Calls) < uint64(len(results)+1) {
				bad = append(bad, r.Key+": hook before Stats counted its call")
			}
			for _, tk := range tickets[r.Key] {
				select {
				case <-tk.Done():
				default:
					bad = append(bad, r.Key+": hook before its waiter was told")
				}
			}
			results = append(results, r)
		}
		exec := func(ctx context.Context, key string, call int) error {
			switch key {
			case "fail":
				return errUser
			case "slow":
				time.Sleep(2 * time.Second)
			}
			return nil
		}
		add := func(key string, tk *Ticket[string, int]) {
			mu.Lock()
			tickets[key] = append(tickets[key], tk)
			mu.Unlock()
		}
		// The hook reads d, which is set only once holdWorker returns: the
		// held call's hook fires at release, after that.
		var (
			hold    *Ticket[string, int]
			release func()
		)
		d, hold, release = holdWorker(t, exec, Config[string, int]{
			Merge:  func(p, in int) (int, error) { return p + in, nil },
			OnDone: hook,
		})
		add(holdKey, hold)
		for i := range 3 {
			add("slow", submit(t, d, "slow", 1, prio(0)))
			if i < 2 {
				require.NoError(t, d.Post("slow", 10, SubmitOptions{}))
			}
		}
		add("fail", submit(t, d, "fail", 0, prio(0)))
		gone := submit(t, d, "gone", 0, prio(0))
		add("gone", gone)
		time.Sleep(3 * time.Second)
		gone.Cancel()
		release()
		mu.Lock()
		var all []*Ticket[string, int]
		for _, tks := range tickets {
			all = append(all, tks...)
		}
		mu.Unlock()
		waitAll(all...)
		synctest.Wait() // the hooks fire after the waiters are told

		mu.Lock()
		defer mu.Unlock()
		assert.Empty(t, bad)
		byKey := map[string][]Result[string, int]{}
		for _, r := range results {
			byKey[r.Key] = append(byKey[r.Key], r)
		}
		for _, key := range []string{holdKey, "slow", "fail", "gone"} {
			require.Len(t, byKey[key], 1, "hook calls for %s", key)
		}
		require.Len(t, results, 4)
		slow := byKey["slow"][0]
		assert.Equal(t, StateSucceeded, slow.State)
		assert.Equal(t, 5, slow.Waiters, "3 tickets + 2 posts")
		assert.Equal(t, 23, slow.Call)
		assert.Equal(t, 1, slow.Attempts)
		assert.Equal(t, 3*time.Second, slow.QueueWait)
		assert.Equal(t, 2*time.Second, slow.RunTime)
		fail := byKey["fail"][0]
		assert.Equal(t, StateFailed, fail.State)
		assert.ErrorIs(t, fail.Err, errUser)
		gr := byKey["gone"][0]
		assert.Equal(t, StateCanceled, gr.State)
		assert.Equal(t, 1, gr.Waiters)
		assert.Zero(t, gr.Attempts)
		assert.Equal(t, 3*time.Second, gr.QueueWait, "a call that never ran waits until its end")

		assert.Equal(t, map[State]int{StateSucceeded: 4, StateFailed: 1, StateCanceled: 1}, tally(t, all...))
		s := closeD(t, d)
		assert.Equal(t, map[State]int{StateSucceeded: 2, StateFailed: 1, StateCanceled: 1}, counts(s.Calls))
		assert.Equal(t, map[State]int{StateSucceeded: 6, StateFailed: 1, StateCanceled: 1}, counts(s.Outcomes))
	})
}
