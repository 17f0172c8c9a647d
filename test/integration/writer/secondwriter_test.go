package writer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
)

// testSecondWriter: while the writer writes its fields of the status
// (phase, observed), another client rewrites the same objects' spec (size)
// and another field of their status (other), each by read-modify-update
// with retry on conflict, as a second controller would. No update is lost
// on either side, and no desire of the writer fails on a 409: in ModeUpdate
// each refused write is re-read and its change applied again; in ModePatch
// the patch tests only the writer's own fields, which the other client
// never changes.
func testSecondWriter(t *testing.T, st *stack) {
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch} {
		t.Run(mode.String(), func(t *testing.T) { secondWriter(t, st, mode) })
	}
}

func secondWriter(t *testing.T, st *stack, mode writer.Mode) {
	const (
		objects = 100
		rounds  = 10 // at least; see below
		round   = 50 * time.Millisecond
		// maxRounds bounds the rounds that wait for a write to meet the
		// other client's (10 s of them).
		maxRounds = 200
	)
	ns := st.namespace(t, "second-"+map[writer.Mode]string{writer.ModeUpdate: "update", writer.ModePatch: "patch"}[mode])
	cfg := st.controller(t, ns)
	objs := st.createWidgets(t, ns, "w", objects)
	var failed atomic.Int64
	w := newWriter(t, cfg, writer.Options[*U]{Mode: mode, QPS: 200, Burst: 20, OnDone: func(r writer.Result[*U]) {
		if r.State != dispatch.StateSucceeded && r.State != dispatch.StateSkipped {
			failed.Add(1)
			t.Errorf("a write ended %v: %v", r.State, r.Err)
		}
	}})

	// The other client: passes over every object, each setting spec.size
	// and status.other to the pass number, until told to stop; then one
	// last pass, whose number every object must end with.
	other := st.admin.Resource(widgets).Namespace(ns)
	var (
		stop   = make(chan struct{})
		passes int64
		errs   = make(chan error, 1)
		wg     sync.WaitGroup
	)
	pass := func(p int64) error {
		for _, obj := range objs {
			name := obj.GetName()
			for _, sub := range []string{"", "status"} {
				err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
					u, err := other.Get(context.Background(), name, metav1.GetOptions{})
					if err != nil {
						return err
					}
					if sub == "" {
						_ = unstructured.SetNestedField(u.Object, p, "spec", "size")
						_, err = other.Update(context.Background(), u, metav1.UpdateOptions{})
					} else {
						_ = unstructured.SetNestedField(u.Object, p, "status", "other")
						_, err = other.UpdateStatus(context.Background(), u, metav1.UpdateOptions{})
					}
					return err
				})
				if err != nil {
					return fmt.Errorf("pass %d, %s %s: %w", p, name, sub, err)
				}
			}
		}
		return nil
	}
	wg.Go(func() {
		for p := int64(1); ; p++ {
			select {
			case <-stop:
				passes = p
				errs <- pass(p)
				return
			default:
			}
			if err := pass(p); err != nil {
				errs <- err
				return
			}
		}
	})

	// The rounds of desires go on past rounds until, in ModeUpdate, a
	// write has met the other client's (a conflict), which is the
	// scenario: on a loaded machine the other client may not have reached
	// the objects while the first rounds' writes were in flight.
	tickets := make([]*writer.Ticket[*U], objects)
	tick := time.NewTicker(round)
	last := -1
	for k := 0; last < 0; k++ {
		if k > 0 {
			<-tick.C
		}
		if k >= rounds-1 && (mode != writer.ModeUpdate || w.Stats().Conflicts > 0 || k >= maxRounds-1) {
			last = k
		}
		for i, obj := range objs {
			// The object as it was created: from the second write on, the
			// writer's own answer is newer, and after its lane ends it
			// knows the object given is stale and reads it.
			d := writer.Desire[*U]{Status: setStatus(map[string]any{"phase": fmt.Sprint("p", k), "observed": int64(k)})}
			if k != last {
				require.NoError(t, w.Set(obj, d, writer.SetOptions{}))
				continue
			}
			var err error
			tickets[i], err = w.Submit(t.Context(), obj, d, writer.SetOptions{})
			require.NoError(t, err)
		}
	}
	tick.Stop()
	for i, tk := range tickets {
		res := wait(t, tk)
		assert.Equal(t, dispatch.StateSucceeded, res.State, "object %d: %v", i, res.Err)
	}
	close(stop)
	wg.Wait()
	require.NoError(t, <-errs, "the other client")

	live := st.list(t, ns)
	for _, obj := range objs {
		got := live[obj.GetName()]
		require.NotNil(t, got)
		assert.Equal(t, fmt.Sprint("p", last), statusOf(got, "phase"), "%s: the writer's update was lost", got.GetName())
		assert.Equal(t, int64(last), statusOf(got, "observed"), got.GetName())
		assert.Equal(t, passes, statusOf(got, "other"), "%s: the other client's status was lost", got.GetName())
		size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size")
		assert.Equal(t, passes, size, "%s: the other client's spec was lost", got.GetName())
	}
	s := w.Stats()
	assert.Zero(t, failed.Load())
	refused := 0
	for _, r := range st.Proxy.Filter(isStatusWrite(ns)) {
		if r.Status == 409 || r.Status == 422 {
			refused++
		}
	}
	if mode == writer.ModeUpdate {
		assert.Positive(t, s.Conflicts, "no write met the other client's: the scenario did not run")
	}
	assert.Equal(t, int(s.Conflicts), refused, "writes refused at the server against conflicts re-applied")
	t.Logf("%v: %d objects, %d rounds of desires against %d passes of the other client: "+
		"%d status writes sent, %d accepted, %d refused as stale and re-applied after %d reads",
		mode, objects, last+1, passes, s.Writes, s.Written, s.Conflicts, s.Reads)
}
