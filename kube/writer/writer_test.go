package writer_test

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestSetWritesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		live := e.get(t, "a")

		require.NoError(t, w.Set(live, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{}))
		settle(t, w)

		assert.Equal(t, corev1.ConditionTrue, conditionOf(e.get(t, "a"), "Ready"))
		assert.Equal(t, 1, e.api.Calls("update/status"))
		assert.Zero(t, e.api.Calls("get"), "the object given was the baseline")
		s := w.Stats()
		assert.Equal(t, uint64(1), s.Desires)
		assert.Equal(t, uint64(1), s.Writes)
		assert.Equal(t, uint64(1), s.Written)
		assert.Zero(t, s.Known, "the baseline is forgotten when the lane ends")
		req := e.api.Requests()[0]
		assert.Equal(t, live.UID, req.Object.(deploy).UID, "the update carries the UID: the fence")
		assert.Equal(t, live.ResourceVersion, req.Object.(deploy).ResourceVersion)
		assert.Equal(t, "dispatch-writer", req.Options.(metav1.UpdateOptions).FieldManager)
	})
}

func TestNoOpIsNeverSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := deployment("a")
		setCondition(d, "Ready", corev1.ConditionTrue, "")
		e := newEnv(t, d)
		w := newWriter(t, e, writer.Options[deploy]{})
		live := e.get(t, "a")

		require.NoError(t, w.Set(live, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{}))
		assert.False(t, w.Busy(live.UID), "nothing is queued for a desire that changes nothing")
		tk, err := w.Submit(t.Context(), live, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSkipped, res.State)
		assert.Equal(t, live, res.Object)
		settle(t, w)

		assert.Empty(t, e.api.Requests())
		s := w.Stats()
		assert.Equal(t, uint64(2), s.Desires)
		assert.Equal(t, uint64(2), s.NoOps)
		assert.Zero(t, s.Dispatch.Submitted, "no queue slot, no token")
	})
}

// A desire that arrives while the object's write is in flight is written
// after it, against the object that write returned: no conflict, no read;
// and every desire after it merges into that one pending write.
func TestCoalesceBehindWriteInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		release := make(chan struct{})
		var once sync.Once
		e.api.Before(func(r fakeapi.Request) {
			if r.Verb == "update" {
				once.Do(func() { <-release })
			}
		})
		w := newWriter(t, e, writer.Options[deploy]{})
		live := e.get(t, "a")

		for i := range int32(10) {
			require.NoError(t, w.Set(live, status(replicas(i+1)), writer.SetOptions{}))
			synctest.Wait()
		}
		close(release)
		settle(t, w)

		assert.Equal(t, int32(10), e.get(t, "a").Status.Replicas, "the last desire wins")
		assert.Equal(t, 2, e.api.Calls("update/status"), "the first write, then one for the nine merged")
		assert.Zero(t, e.api.Calls("get"))
		s := w.Stats()
		assert.Equal(t, uint64(10), s.Desires)
		assert.Equal(t, uint64(8), s.Dispatch.Coalesced)
		assert.Zero(t, s.Conflicts)
	})
}

// With the rate limited, desires for many objects queue, and each
// object's later desires merge into its queued write.
func TestCoalesceWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var objs []deploy
		e := newEnv(t)
		for i := range 20 {
			d := deployment(fmt.Sprint("d", i))
			_, err := e.cs.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{})
			require.NoError(t, err)
			objs = append(objs, e.get(t, d.Name))
		}
		w := newWriter(t, e, writer.Options[deploy]{QPS: 5, Burst: 1})
		for round := range int32(10) {
			for _, o := range objs {
				require.NoError(t, w.Set(o, status(replicas(round)), writer.SetOptions{}))
			}
		}
		settle(t, w)

		for _, o := range objs {
			assert.Equal(t, int32(9), e.get(t, o.Name).Status.Replicas)
		}
		writes := e.api.Calls("update/status")
		assert.LessOrEqual(t, writes, 21, "about one write per object, not one per desire")
		s := w.Stats()
		assert.Equal(t, uint64(200), s.Desires)
		assert.Equal(t, uint64(writes), s.Written)
		assert.Zero(t, s.Conflicts, "an object older than the writer's own write is read, not sent")
	})
}

// Merge: Chain keeps partial desires that would otherwise replace one
// another; without it the newest desire is the whole truth.
func TestMergeChain(t *testing.T) {
	for _, chain := range []bool{false, true} {
		t.Run(fmt.Sprint("chain=", chain), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				release := make(chan struct{})
				var once sync.Once
				e.api.Before(func(r fakeapi.Request) {
					if r.Verb == "update" {
						once.Do(func() { <-release })
					}
				})
				o := writer.Options[deploy]{}
				if chain {
					o.Merge = writer.Chain[deploy]
				}
				w := newWriter(t, e, o)
				live := e.get(t, "a")
				require.NoError(t, w.Set(live, status(replicas(1)), writer.SetOptions{}))
				synctest.Wait() // in flight, held
				require.NoError(t, w.Set(live, status(condition("A", corev1.ConditionTrue)), writer.SetOptions{}))
				require.NoError(t, w.Set(live, status(condition("B", corev1.ConditionTrue)), writer.SetOptions{}))
				close(release)
				settle(t, w)

				got := e.get(t, "a")
				assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "B"))
				if chain {
					assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "A"))
				} else {
					assert.Empty(t, conditionOf(got, "A"), "replaced by the newer desire")
				}
				assert.Equal(t, 2, e.api.Calls("update/status"))
			})
		})
	}
}

// A write refused as stale (409) is re-read, the change applied again to
// what was read — the other writer's change kept — and written.
func TestConflictReappliesChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		var once sync.Once
		e.api.Before(func(r fakeapi.Request) {
			if r.Key() == "update/status" {
				once.Do(func() { // a second writer lands first
					assert.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) {
						setCondition(o.(deploy), "Other", corev1.ConditionTrue, "theirs")
					}))
				})
			}
		})
		w := newWriter(t, e, writer.Options[deploy]{})
		live := e.get(t, "a")

		tk, err := w.Submit(t.Context(), live, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)

		assert.Equal(t, dispatch.StateSucceeded, res.State)
		got := e.get(t, "a")
		assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "Ready"))
		assert.Equal(t, corev1.ConditionTrue, conditionOf(got, "Other"), "the other writer's change is kept")
		assert.Equal(t, got.ResourceVersion, res.Object.ResourceVersion, "the result is the server's answer")
		assert.Equal(t, 1, res.Writes)
		assert.Equal(t, 2, res.Attempts)
		s := w.Stats()
		assert.Equal(t, uint64(1), s.Conflicts)
		assert.Equal(t, uint64(1), s.Reads)
	})
}

// After a conflict, a desire the other writer already met is not written.
func TestConflictThatMeetsTheDesireIsNotWritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		live := e.get(t, "a")
		d := live.DeepCopy()
		setCondition(d, "Ready", corev1.ConditionTrue, "")
		_, err := e.cs.AppsV1().Deployments("default").UpdateStatus(t.Context(), d, metav1.UpdateOptions{})
		require.NoError(t, err)
		w := newWriter(t, e, writer.Options[deploy]{})

		tk, err := w.Submit(t.Context(), live, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSkipped, res.State, "re-read, and found done")
		assert.Zero(t, res.Writes)
		assert.Equal(t, 2, e.api.Calls("update/status"), "the other writer's, and the stale one refused")
	})
}

// The baseline is the newest object known: the server's last answer
// beats an older object given to Set.
func TestNewerBaselineWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		release := make(chan struct{})
		var once sync.Once
		e.api.Before(func(r fakeapi.Request) {
			if r.Verb == "update" {
				once.Do(func() { <-release })
			}
		})
		w := newWriter(t, e, writer.Options[deploy]{})
		stale := e.get(t, "a")
		require.NoError(t, w.Set(stale, status(replicas(1)), writer.SetOptions{}))
		synctest.Wait()
		require.NoError(t, w.Set(stale, status(replicas(2)), writer.SetOptions{}))
		close(release)
		settle(t, w)

		assert.Equal(t, int32(2), e.get(t, "a").Status.Replicas)
		assert.Zero(t, w.Stats().Conflicts, "the second write used the first one's answer")
	})
}
