package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The package's tests run with the lifecycle checked: a call's move that
// the transitions table does not list panics (enter, lifecycle.go).
func init() { checkTransitions = true }

// TestLifecycleTransitions drives every move the transitions table lists
// (and no other: enter crashes on one), so the table is the lifecycle the
// code follows, not a comment.
func TestLifecycleTransitions(t *testing.T) {
	var mu sync.Mutex
	seen := map[[2]callState]bool{}
	onTransition = func(from, to callState) {
		mu.Lock()
		seen[[2]callState{from, to}] = true
		mu.Unlock()
	}
	defer func() { onTransition = nil }()

	synctest.Test(t, func(t *testing.T) {
		gates := map[string]chan struct{}{"a": make(chan struct{}), "p": make(chan struct{}), "q": make(chan struct{}), "rq": make(chan struct{})}
		var failed sync.Map // keys whose first attempt failed already
		exec := func(ctx context.Context, key string, v int) error {
			if g := gates[key]; g != nil {
				select {
				case <-g:
				case <-ctx.Done():
				}
			}
			if strings.HasPrefix(key, "slow") {
				time.Sleep(time.Second)
			}
			if strings.HasPrefix(key, "r") || key == "p" {
				if _, again := failed.LoadOrStore(key, true); !again {
					return errors.New("try again")
				}
			}
			return nil
		}
		d := newD(t, exec, Config[string, int]{
			Workers:  1,
			Classify: func(error) Class { return ClassRetry },
			Retry:    RetryPolicy{InitialBackoff: time.Second, Jitter: JitterNone, BudgetRatio: math.Inf(1)},
			Label:    func(key string, _ int) string { return key[:1] },
			Tenants:  map[string]TenantConfig{"quota": {MaxQueued: 1}},
			Merge: func(pending, in int) (int, error) {
				if in < 0 {
					return in, ReplacePending
				}
				return in, nil
			},
		})
		// new → ready → taken → running; new → behind; new → ready (b waits
		// for the one worker); ready → finished; behind → finished.
		require.NoError(t, d.Post("a", 1, SubmitOptions{}))
		synctest.Wait()
		behind := submit(t, d, "a", 2, SubmitOptions{})
		b := submit(t, d, "b", 1, SubmitOptions{})
		require.True(t, d.Cancel("b", nil))
		require.True(t, d.Cancel("a", nil)) // the successor leaves; the running call is orphaned
		close(gates["a"])
		waitAll(behind, b) // running → ended → finished (Stale)

		// ended → taken → delayed (a retry); delayed → ready → taken.
		waitAll(submit(t, d, "r1", 1, SubmitOptions{}))
		// delayed → finished: cancelled during its backoff.
		r2 := submit(t, d, "r2", 1, SubmitOptions{})
		synctest.Wait()
		require.True(t, d.Cancel("r2", nil))
		waitAll(r2)

		// taken → ready: a retry whose successor replaces it (ReplacePending)
		// goes back ready at once.
		require.NoError(t, d.Post("p", 1, SubmitOptions{}))
		synctest.Wait()
		succ := submit(t, d, "p", -1, SubmitOptions{})
		close(gates["p"])
		waitAll(succ)

		// delayed → delayed and ready → ready: a replacement in another
		// tenant re-indexes the pending call (adopt); delayed → ready: its
		// backoff is dropped (restart).
		r3 := submit(t, d, "r3", 1, SubmitOptions{})
		synctest.Wait()                                                            // failed once, in backoff
		r3b := submit(t, d, "r3", 1, SubmitOptions{Priority: 5, Tenant: "other"})  // adopt
		r3c := submit(t, d, "r3", -1, SubmitOptions{Priority: 5, Tenant: "other"}) // restart
		// behind → ready: q's successor, once q finishes.
		require.NoError(t, d.Post("q", 1, SubmitOptions{})) // holds the worker
		synctest.Wait()
		qs := submit(t, d, "q", 2, SubmitOptions{})
		q2 := submit(t, d, "r4", 1, SubmitOptions{})
		q3 := submit(t, d, "r4", -2, SubmitOptions{Tenant: "third"})
		close(gates["q"])
		waitAll(r3, r3b, r3c, qs, q2, q3)

		// taken → finished: a retry that has room under its tenant's quota
		// only in its successor's place, whose merge refuses the successor
		// (another idempotency key), fails; the successor runs alone.
		require.NoError(t, d.Post("rq", 1, SubmitOptions{Tenant: "quota", IdempotencyKey: "one"}))
		synctest.Wait()
		rqs := submit(t, d, "rq", 2, SubmitOptions{Tenant: "quota", IdempotencyKey: "two"})
		close(gates["rq"])
		waitAll(rqs)
		assert.Equal(t, StateSucceeded, outcome(t, rqs).State)

		// ready → finished: the deadline check learns that "slow" calls take
		// a second and does not start one with less time left.
		var warm []*Ticket[string, int]
		for i := range 20 {
			warm = append(warm, submit(t, d, fmt.Sprint("slow", i), 1, SubmitOptions{}))
		}
		waitAll(warm...)
		late := submit(t, d, "slow-late", 1, SubmitOptions{Deadline: time.Now().Add(100 * time.Millisecond)})
		waitAll(late)
		assert.Equal(t, StateExpired, outcome(t, late).State)
		closeD(t, d)
	})

	for from := range nCallStates {
		for to := range nCallStates {
			listed := transitions[from]&(1<<to) != 0
			assert.Equal(t, listed, seen[[2]callState{from, to}], "%v → %v: listed %v", from, to, listed)
		}
	}
}
