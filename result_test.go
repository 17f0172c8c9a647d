package dispatch

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestStatsByState: Stats reports every terminal state, counted or not,
// so that its maps do not freeze the number of states into the API.
func TestStatsByState(t *testing.T) {
	var c stateCounts
	c[StateSucceeded], c[StateFailed], c[StateClosed] = 3, 2, 1
	m := c.byState()
	assert.Len(t, m, numStates-1)
	assert.Equal(t, uint64(3), m[StateSucceeded])
	assert.Equal(t, uint64(0), m[StateStale])
	assert.Equal(t, uint64(6), total(m))
}

// TestLeaveMidExecutionAttempts: a waiter that leaves while its call runs
// is told the executions that had returned: Attempts 0 and RunTime 0 while
// the first runs, though that one goes on for the call's other waiters and
// may take effect; its QueueWait runs to the first execution's start. The
// waiters that stay are told every execution.
func TestLeaveMidExecutionAttempts(t *testing.T) {
	docSays(t, "Outcome", "Attempts counts the executions that had ended when the outcome was decided — returned, and their error judged (Config.Classify) — and RunTime sums exec's time over them: a waiter that leaves while one runs or is judged (Cancel, its context or its deadline) is not told of that one — Attempts is 0 while the first runs, though it may yet take effect")
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		d, _, release := holdWorker(t, func(ctx context.Context, _ string, _ int) error {
			if n.Add(1) == 1 {
				time.Sleep(10 * time.Second)
				return syscall.ECONNRESET
			}
			time.Sleep(5 * time.Second)
			return nil
		}, Config[string, int]{Retry: noJitter(3)})
		stay := submit(t, d, "k", 1, SubmitOptions{}) // one call, queued
		first := submit(t, d, "k", 1, SubmitOptions{})
		second := submit(t, d, "k", 1, SubmitOptions{})
		release()                   // k starts
		time.Sleep(4 * time.Second) // 6s into the first execution
		first.Cancel()
		time.Sleep(8 * time.Second) // the retry began at 10.1s: 1.9s into it
		second.Cancel()
		r1, r2, r := outcome(t, first), outcome(t, second), outcomeWait(t, stay)
		assert.Equal(t, StateCanceled, r1.State)
		assert.Equal(t, 0, r1.Attempts, "the first execution runs")
		assert.Zero(t, r1.RunTime)
		assert.Zero(t, r1.QueueWait, "it started at once")
		assert.Equal(t, StateCanceled, r2.State)
		assert.Equal(t, 1, r2.Attempts, "the first execution had returned, the second runs")
		assert.Equal(t, 10*time.Second, r2.RunTime)
		assert.Equal(t, StateSucceeded, r.State)
		assert.Equal(t, 2, r.Attempts)
		assert.Equal(t, 15*time.Second, r.RunTime)
		closeD(t, d)
	})
}

// TestLeaveWhileJudgedAttempts: an execution whose error is being judged
// has returned, but has not ended: a waiter that leaves then (here,
// Cancel from Config.Classify itself) is not told of it, in both modes,
// and the call's end (OnDone, Stale) is.
func TestLeaveWhileJudgedAttempts(t *testing.T) {
	docSays(t, "Outcome", "Attempts counts the executions that had ended when the outcome was decided — returned, and their error judged (Config.Classify)")
	bothModes(t, func(t *testing.T, mode Mode) {
		var d *Dispatcher[string, int]
		cause := errors.New("left")
		hooks := &hookLog[string, int]{}
		cfg := Config[string, int]{
			Retry: noJitter(3), Rollout: RolloutPolicy{Mode: mode}, OnDone: hooks.add,
			Classify: func(error) Class {
				d.Cancel("k", cause) // exec has returned
				return ClassRetry
			},
		}
		d = newD(t, func(context.Context, string, int) error {
			time.Sleep(3 * time.Second)
			return syscall.ECONNRESET
		}, cfg)
		r := outcomeWait(t, submit(t, d, "k", 1, SubmitOptions{}))
		assert.Equal(t, StateCanceled, r.State)
		assert.ErrorIs(t, r.Err, cause)
		assert.Equal(t, 0, r.Attempts, "the execution was being judged")
		assert.Zero(t, r.RunTime)
		closeD(t, d)
		ends := hooks.all()
		if assert.Len(t, ends, 1) {
			assert.Equal(t, StateStale, ends[0].State)
			assert.Equal(t, 1, ends[0].Attempts, "the call's end is told every execution")
			assert.Equal(t, 3*time.Second, ends[0].RunTime)
		}
	})
}

// TestQueueWaitIsTheCalls: a submission that joins a queued call is told
// the call's queue wait — from the earliest enqueue among its waiters
// still live — not its own, as its outcome is the call's.
func TestQueueWaitIsTheCalls(t *testing.T) {
	docSays(t, "Outcome", "QueueWait is the call's: from the earliest enqueue among its live waiters to its first execution, or to the end")
	synctest.Test(t, func(t *testing.T) {
		d, _, release := holdWorker(t, nopExec, Config[string, int]{})
		a := submit(t, d, "k", 1, SubmitOptions{})
		time.Sleep(2 * time.Second)
		b := submit(t, d, "k", 1, SubmitOptions{})
		time.Sleep(2 * time.Second)
		c := submit(t, d, "k", 1, SubmitOptions{})
		time.Sleep(2 * time.Second)
		a.Cancel() // the call's enqueue is b's now
		time.Sleep(4 * time.Second)
		release() // 10s after a, 8s after b, 6s after c
		assert.Equal(t, 6*time.Second, outcome(t, a).QueueWait, "a left at 6s, before the call ran")
		assert.Equal(t, 8*time.Second, outcome(t, b).QueueWait)
		assert.Equal(t, 8*time.Second, outcome(t, c).QueueWait, "c shares the call's wait")
		closeD(t, d)
	})
}
