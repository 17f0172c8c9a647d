package writer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// create makes n Deployments in namespace ns and returns them as stored.
func (e *env) create(t *testing.T, ns string, n int) []deploy {
	t.Helper()
	var out []deploy
	for i := range n {
		d := deploymentIn(ns, fmt.Sprint(ns, "-", i))
		_, err := e.cs.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{})
		require.NoError(t, err)
		out = append(out, e.getIn(t, ns, d.Name))
	}
	return out
}

// order returns the names of the objects written, in order.
func (e *env) order() []string {
	var names []string
	for _, r := range e.api.Requests() {
		names = append(names, r.Name)
	}
	return names
}

// During a storm of routine writes at the writer's rate, a Ready flip
// takes the next token.
func TestReadyClassOvertakesTheStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		storm := e.create(t, "default", 50)
		flip := e.create(t, "urgent", 1)[0]
		w := newWriter(t, e, writer.Options[deploy]{
			QPS: 10, Burst: 1,
			Classes: map[string]int{"ready": 10, "routine": 0},
		})
		for _, d := range storm {
			require.NoError(t, w.Set(d, status(replicas(1)), writer.SetOptions{Class: "routine"}))
		}
		time.Sleep(time.Second) // ten routine writes out
		start := time.Now()
		tk, err := w.Submit(t.Context(), flip, status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{Class: "ready"})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		require.NoError(t, err)
		assert.LessOrEqual(t, time.Since(start), 100*time.Millisecond, "one token's wait")
		i := slices.Index(e.order(), flip.Name)
		assert.LessOrEqual(t, i, 12, "written right after the routine writes already out")
	})
}

// One noisy namespace fills its own quota and is refused; the others are
// still admitted, and take turns with it.
func TestTenantsPerNamespace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		noisy, quiet := e.create(t, "noisy", 20), e.create(t, "quiet", 3)
		w := newWriter(t, e, writer.Options[deploy]{
			QPS: 1, Burst: 1, Workers: 1,
			Tenancy:       writer.TenancyNamespace,
			DefaultTenant: dispatch.TenantConfig{MaxQueued: 5},
		})
		require.NoError(t, w.Set(noisy[0], status(replicas(1)), writer.SetOptions{}))
		synctest.Wait() // in flight
		var refused int
		for _, d := range noisy[1:] {
			if err := w.Set(d, status(replicas(1)), writer.SetOptions{}); err != nil {
				require.ErrorIs(t, err, dispatch.ErrBackpressure)
				refused++
			}
		}
		assert.Equal(t, 14, refused, "one in flight, five queued")
		for _, d := range quiet {
			require.NoError(t, w.Set(d, status(replicas(1)), writer.SetOptions{}))
		}
		s := w.Stats().Dispatch
		assert.Equal(t, uint64(14), s.Tenants["noisy"].Rejected)
		settle(t, w)
		// Stride scheduling at one priority: the quiet namespace's three
		// writes are interleaved with the noisy one's, not after them.
		order := e.order()
		last := slices.IndexFunc(order, func(n string) bool { return n == "quiet-2" })
		assert.Less(t, last, 8, "%v", order)
	})
}

func TestCapacityBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ds := e.create(t, "default", 4)
		release := make(chan struct{})
		defer close(release)
		e.api.Before(func(r fakeapi.Request) {
			if r.Name == ds[0].Name {
				<-release
			}
		})
		w := newWriter(t, e, writer.Options[deploy]{QPS: 1, Burst: 1, Capacity: 2})
		require.NoError(t, w.Set(ds[0], status(replicas(1)), writer.SetOptions{}))
		synctest.Wait() // in flight, held
		require.NoError(t, w.Set(ds[1], status(replicas(1)), writer.SetOptions{Droppable: true}))
		err := w.Set(ds[2], status(replicas(1)), writer.SetOptions{})
		require.ErrorIs(t, err, dispatch.ErrBackpressure, "a full writer refuses a new object")
		require.NoError(t, w.Set(ds[1], status(replicas(2)), writer.SetOptions{}), "an object already queued merges, full or not")

		tk, err := w.Submit(t.Context(), ds[3], status(replicas(1)), writer.SetOptions{})
		require.ErrorIs(t, err, dispatch.ErrBackpressure, "ds[1] is no longer droppable: one desire in it is not")
		assert.Nil(t, tk)
	})
}

// Close drains what is queued; given less time, it ends the rest Closed,
// says how many, and OnDone hears each.
func TestCloseDrainsOrReports(t *testing.T) {
	for _, patient := range []bool{true, false} {
		t.Run(fmt.Sprint("patient=", patient), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				ds := e.create(t, "default", 10)
				closed := 0
				w, err := writer.New(e.c, writer.Options[deploy]{QPS: 2, Burst: 1, OnDone: func(r writer.Result[deploy]) {
					if r.State == dispatch.StateClosed {
						closed++
					}
				}})
				require.NoError(t, err)
				for _, d := range ds {
					require.NoError(t, w.Set(d, status(replicas(1)), writer.SetOptions{}))
				}
				wait := time.Minute
				if !patient {
					wait = 2 * time.Second
				}
				ctx, cancel := context.WithTimeout(t.Context(), wait)
				defer cancel()
				err = w.Close(ctx)
				require.ErrorIs(t, w.Set(ds[0], status(replicas(2)), writer.SetOptions{}), dispatch.ErrClosed)
				if patient {
					require.NoError(t, err)
					assert.Equal(t, 10, e.api.Calls("update/status"))
					return
				}
				require.ErrorIs(t, err, context.DeadlineExceeded)
				n := w.Stats().Dispatch.Outcomes[dispatch.StateClosed]
				assert.Contains(t, err.Error(), fmt.Sprintf("%d desires ended Closed", n))
				assert.Positive(t, closed)
				assert.LessOrEqual(t, uint64(closed), n, "a write cancelled in flight reaches OnDone Stale")
				sum := uint64(e.api.Calls("update/status")) + n
				assert.GreaterOrEqual(t, sum, uint64(10), "each desire was written or ended Closed")
				assert.LessOrEqual(t, sum, uint64(11), "or both: the one in flight")
				assert.NoError(t, w.Close(t.Context()), "idempotent")
			})
		})
	}
}

// A desire for the status and the object: the status first, then the
// object, against the status write's answer.
func TestStatusThenObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		d := e.get(t, "a")
		d.Finalizers = []string{"example.com/cleanup"}
		require.NoError(t, e.cs.Tracker().Update(deploymentsGVR, d, "default"))
		d = e.get(t, "a")
		w := newWriter(t, e, writer.Options[deploy]{})

		tk, err := w.Submit(t.Context(), d, writer.Desire[deploy]{
			Status: condition("Ready", corev1.ConditionFalse),
			Object: func(d deploy) error { d.Finalizers = nil; return nil },
		}, writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)

		assert.Equal(t, 2, res.Writes)
		assert.Equal(t, []string{"update/status", "update"}, []string{e.api.Requests()[0].Key(), e.api.Requests()[1].Key()})
		assert.Empty(t, res.Object.Finalizers)
		assert.Equal(t, corev1.ConditionFalse, conditionOf(res.Object, "Ready"))
		assert.Zero(t, w.Stats().Conflicts, "the object's write used the status write's answer")
	})
}

// An object given without a resourceVersion (identity only) is read first.
func TestIdentityOnlyIsReadFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		id := e.get(t, "a")
		id.ResourceVersion = ""
		w := newWriter(t, e, writer.Options[deploy]{})
		tk, err := w.Submit(t.Context(), id, status(replicas(4)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 1, e.api.Calls("get"))
		assert.Equal(t, int32(4), res.Object.Status.Replicas)
		s := w.Stats()
		assert.Equal(t, uint64(1), s.Reads)
	})
}
