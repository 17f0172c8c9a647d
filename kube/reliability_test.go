package kube

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The preset's promises under failure and time.

// TestPresetAgedStorm: with the default Options, a binding
// submitted into a storm of 2 000 queued status patches waits for one
// token of the preset's 50 qps, however old the storm — 12 s used to lift
// the patches past it (it waited 26 s behind 1 300 of them) — and the
// patches drain at the full rate again once it has run.
func TestPresetAgedStorm(t *testing.T) {
	for _, age := range []time.Duration{12 * time.Second, 35 * time.Second} {
		t.Run("age="+age.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI()
				api.latency = 20 * time.Millisecond
				var bindAt time.Time
				api.onStart = func(kind, name string, _ map[string]int) {
					if kind == "create/binding" {
						bindAt = time.Now()
					}
				}
				d := newTestDispatcher(t, api, Options{})
				for i := range 2000 {
					pod := api.add(newPod(fmt.Sprintf("p%d", i)))
					require.NoError(t, d.Post(PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/100 nodes")}}), SubmitOptions{}))
				}
				bound := api.add(newPod("bound"))
				time.Sleep(age)
				synctest.Wait()
				before := api.count("patch/status")
				submitted := time.Now()
				tk := submit(t, d, Bind(bound, "n1"))
				r := outcome(t, tk)
				assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
				assert.LessOrEqual(t, bindAt.Sub(submitted), time.Second/stormQPS, "the binding waited for more than one token")
				time.Sleep(time.Second)
				synctest.Wait()
				assert.InDelta(t, stormQPS, api.count("patch/status")-before, 3, "the patches drain at the full rate")
				ctx, cancel := contextDone()
				defer cancel()
				_ = d.Close(ctx) // the rest of the storm ends Closed
			})
		})
	}
}

// TestReplacementStartsFresh: a call that replaces a
// pending call of another kind is a new operation. A binding replacing a
// status patch that waits out its retry is sent at once and succeeds
// after one request (it used to end Failed with the patch's attempts, or
// run the patch's before-retry check on the patch's 409 without ever being
// sent); a deletion replacing a pending binding runs, and is counted, as a
// deletion.
func TestReplacementStartsFresh(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"after a 500", apierrors.NewInternalError(errors.New("etcd"))},
		{"after a 409", apierrors.NewConflict(podsResource, "p", errors.New("stale"))},
	} {
		t.Run("binding replaces a retrying status patch "+tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI()
				pod := api.add(newPod("p"))
				api.setFault(func(r request) (bool, error) {
					if r.kind() == "patch/status" {
						return false, tc.err
					}
					return true, nil
				})
				d := newTestDispatcher(t, api, Options{Retry: dispatch.RetryPolicy{InitialBackoff: time.Minute, Jitter: dispatch.JitterNone}})
				require.NoError(t, d.Post(PatchStatus(pod, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}}), SubmitOptions{}))
				time.Sleep(time.Second) // the patch failed, and waits a minute (or was rebuilt)
				synctest.Wait()
				at := time.Now()
				r := outcome(t, submit(t, d, Bind(api.pod("p"), "n1")))
				assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
				assert.Equal(t, 1, r.Attempts)
				assert.Less(t, time.Since(at), time.Second, "the binding waited out the patch's backoff")
				assert.Equal(t, 1, api.count("create/binding"))
				assert.Equal(t, "n1", api.pod("p").Spec.NodeName)
			})
		})
	}
	t.Run("deletion replaces a pending binding", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			api := newFakeAPI(newPod("hold"), newPod("p"))
			obs := &countObserver{finished: map[dispatch.Event]int{}}
			d := newTestDispatcher(t, api, Options{Workers: 1, Observer: obs, Start: dispatch.StartPolicy{ReservedWorkers: -1}})
			release := api.hold("create/binding", "hold")
			first := submit(t, d, Bind(api.pod("hold"), "n1"))
			synctest.Wait() // the one worker is busy
			bind := submit(t, d, Bind(api.pod("p"), "n1"))
			del := submit(t, d, Delete(api.pod("p"), nil))
			s := d.Stats()
			assert.Equal(t, 1, s.Tenants[string(PodDeletion)].Queued, "the replaced binding's tenant holds it")
			assert.Zero(t, s.Tenants[string(PodBinding)].Queued)
			release()
			waitAll(first, bind, del)
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, del).State)
			closeD(t, d)
			assert.Equal(t, 1, obs.finished[dispatch.Event{Label: string(PodDeletion), Tenant: string(PodDeletion)}])
			assert.Equal(t, 1, obs.finished[dispatch.Event{Label: string(PodBinding), Tenant: string(PodBinding)}], "only the first binding")
		})
	})
}

// TestPatchBehindFailingBinding: a status patch submitted while
// the pod's binding is in flight waits behind it and runs next, even when
// the binding fails retryably (500 three times) — it used to end Skipped,
// its condition never landing.
func TestPatchBehindFailingBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		api.setFault(func(r request) (bool, error) {
			if r.kind() == "create/binding" {
				return false, apierrors.NewInternalError(errors.New("etcd"))
			}
			return true, nil
		})
		d := newTestDispatcher(t, api, Options{})
		release := api.hold("create/binding", "p")
		bind := submit(t, d, Bind(api.pod("p"), "n1"))
		synctest.Wait() // in flight
		patch := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/1 nodes")}}))
		release()
		waitAll(bind, patch)
		assert.Equal(t, dispatch.StateFailed, outcome(t, bind).State)
		r := outcome(t, patch)
		assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
		assert.True(t, scheduledFalse(api.pod("p")), "the patch's condition landed")
	})
}

func waitAll(tks ...*Ticket) {
	for _, tk := range tks {
		<-tk.Done()
	}
}

// scheduledFalse reports whether pod carries PodScheduled=False.
func scheduledFalse(pod *v1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return true
		}
	}
	return false
}

// contextDone returns a context that has already ended.
func contextDone() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}
