package kube

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
)

// TestBindingTokenOutlivesExpiredPatch: a binding that waits for its token
// starts when the token is due, even if a status patch's deadline, due
// earlier, woke the dispatcher's clock first — and Close then returns.
// The clock used to forget the token's time when it woke for the
// deadline: the binding never started in a quiet period, and
// Close(context.Background()) never returned.
func TestBindingTokenOutlivesExpiredPatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI()
		api.latency = time.Millisecond
		var bindAt time.Time
		api.onStart = func(kind, _ string, _ map[string]int) {
			if kind == "create/binding" {
				bindAt = time.Now()
			}
		}
		d := newTestDispatcher(t, api, Options{QPS: 10, Burst: 1})
		first := api.add(newPod("first"))
		require.NoError(t, d.Post(PatchStatus(first, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}}), SubmitOptions{}))
		synctest.Wait() // the one token is spent; the next is due in 100 ms
		start := time.Now()
		bound := api.add(newPod("bound"))
		tk := submit(t, d, Bind(bound, "n1"))
		synctest.Wait() // the binding waits for the token
		late := api.add(newPod("late"))
		require.NoError(t, d.Post(PatchStatus(late, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}}),
			SubmitOptions{Deadline: time.Now().Add(30 * time.Millisecond)}))
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case <-tk.Done():
		default:
			require.FailNow(t, "the binding never started")
		}
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		assert.Equal(t, 100*time.Millisecond, bindAt.Sub(start), "the binding started when its token was due")
		require.NoError(t, d.Close(context.Background()))
	})
}
