package kube

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// retryLog records the observer's retry events.
type retryLog struct {
	dispatch.NopObserver
	mu      sync.Mutex
	retries []retryEvent
}

type retryEvent struct {
	Label string
	Delay time.Duration
	Err   error
}

func (l *retryLog) OnRetry(e dispatch.Event, _ int, delay time.Duration, err error) {
	l.mu.Lock()
	l.retries = append(l.retries, retryEvent{e.Label, delay, err})
	l.mu.Unlock()
}

func (l *retryLog) get() []retryEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]retryEvent(nil), l.retries...)
}

// failFirst answers the first request of kind with err; apply says whether
// the server carries it out all the same (a lost response).
func failFirst(kind string, err error, apply bool) fault {
	return func(r request) (bool, error) {
		if r.kind() == kind && r.N == 1 {
			return apply, err
		}
		return true, nil
	}
}

func connReset() error {
	return &url.Error{Op: "Post", URL: "https://apiserver/api/v1/namespaces/default/pods/p/binding",
		Err: &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}}
}

// TestErrorPaths runs each classification path through the dispatcher: an
// error on the first request of a call, what the dispatcher makes of it
// (outcome, executions, the requests that reach the server), and the pod
// left on the server. Retries use the default policy (3 attempts).
func TestErrorPaths(t *testing.T) {
	gr := podsResource
	condition := &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
	patch := func(p *v1.Pod) Call {
		return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes")}})
	}
	bind := func(p *v1.Pod) Call { return Bind(p, "n1") }
	del := func(p *v1.Pod) Call { return Delete(p, nil) }
	preempt := func(p *v1.Pod) Call { return Delete(p, condition) }
	cases := []struct {
		name     string
		call     func(*v1.Pod) Call
		noPod    bool               // the pod does not exist on the server
		after    func(api *fakeAPI) // changes the server once the call is built
		fault    fault
		state    dispatch.State
		attempts int
		reason   string // for Failed
		requests []string
		check    func(t *testing.T, api *fakeAPI, r Result)
	}{
		// Retry.
		{name: "patch: 500 is retried", call: patch, fault: failFirst("patch/status", apierrors.NewInternalError(errors.New("etcd")), false),
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"patch/status", "patch/status"}},
		{name: "patch: 503 is retried", call: patch, fault: failFirst("patch/status", apierrors.NewServiceUnavailable("down"), false),
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"patch/status", "patch/status"}},
		{name: "patch: 504 is retried", call: patch, fault: failFirst("patch/status", apierrors.NewTimeoutError("slow", 0), false),
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"patch/status", "patch/status"}},
		{
			// The patch landed but its response was lost: the resend carries
			// the old resourceVersion, is refused, and the pod read back
			// shows there is nothing left to do.
			name: "patch: a lost response ends Skipped on the resend", call: patch, fault: failFirst("patch/status", connReset(), true),
			state: dispatch.StateSkipped, attempts: 2, requests: []string{"patch/status", "patch/status", "get/"},
			check: func(t *testing.T, api *fakeAPI, _ Result) {
				assert.Equal(t, "0/3 nodes", findCondition(&api.pod("p").Status, v1.PodScheduled).Message)
			},
		},
		{name: "patch: every attempt fails", call: patch, fault: func(r request) (bool, error) { return false, apierrors.NewServiceUnavailable("down") },
			state: dispatch.StateFailed, attempts: 3, reason: "attempts", requests: []string{"patch/status", "patch/status", "patch/status"}},

		// Recompute.
		{
			name: "patch: a conflict is rebuilt from the pod read back", call: patch,
			fault: failFirst("patch/status", apierrors.NewConflict(gr, "p", errors.New("modified")), false),
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"patch/status", "get/", "patch/status"},
		},
		{
			name: "patch: a conflict on a pod that is gone", call: patch,
			fault: func(r request) (bool, error) {
				switch r.kind() {
				case "patch/status":
					return false, apierrors.NewConflict(gr, "p", errors.New("modified"))
				case "get/":
					return false, apierrors.NewNotFound(gr, "p")
				}
				return true, nil
			},
			state: dispatch.StateFailed, attempts: 1, reason: "before_retry", requests: []string{"patch/status", "get/"},
			check: func(t *testing.T, _ *fakeAPI, r Result) {
				assert.True(t, apierrors.IsNotFound(r.Err))
			},
		},
		{
			name: "bind: a lost response is found bound and ends Succeeded without binding again", call: bind,
			fault: failFirst("create/binding", connReset(), true),
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"create/binding", "get/"},
		},
		{
			// The read after the lost response fails too, so the binding is
			// sent again: the server answers 409 "already assigned", and the
			// pod read back shows the first attempt took effect.
			name: "bind: retried after a success it could not see, meets 409, ends Succeeded", call: bind,
			fault: func(r request) (bool, error) {
				switch {
				case r.kind() == "create/binding" && r.N == 1:
					return true, apierrors.NewServiceUnavailable("response lost")
				case r.kind() == "get/" && r.N == 1:
					return false, apierrors.NewServiceUnavailable("still down")
				}
				return true, nil
			},
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"create/binding", "get/", "create/binding", "get/"},
			check: func(t *testing.T, _ *fakeAPI, r Result) { assert.NoError(t, r.Err) },
		},
		{
			name: "bind: already assigned to another node ends Failed", call: bind,
			after: func(api *fakeAPI) { api.change("p", func(p *v1.Pod) { p.Spec.NodeName = "n2" }) },
			state: dispatch.StateFailed, attempts: 1, reason: "before_retry", requests: []string{"create/binding", "get/"},
			check: func(t *testing.T, _ *fakeAPI, r Result) {
				assert.True(t, apierrors.IsConflict(r.Err), "the server's answer is kept in the chain")
				assert.ErrorContains(t, r.Err, "bound to node n2")
			},
		},

		// Permanent.
		{name: "patch: NotFound, the pod is gone", call: patch, noPod: true,
			state: dispatch.StateFailed, attempts: 1, reason: "permanent", requests: []string{"patch/status"}},
		{name: "bind: NotFound, the pod is gone", call: bind, noPod: true,
			state: dispatch.StateFailed, attempts: 1, reason: "permanent", requests: []string{"create/binding"}},
		{name: "patch: Forbidden", call: patch, fault: failFirst("patch/status", apierrors.NewForbidden(gr, "p", errors.New("rbac")), false),
			state: dispatch.StateFailed, attempts: 1, reason: "permanent", requests: []string{"patch/status"}},
		{name: "bind: Invalid", call: bind, fault: failFirst("create/binding", apierrors.NewBadRequest("no such node"), false),
			state: dispatch.StateFailed, attempts: 1, reason: "permanent", requests: []string{"create/binding"}},

		// Deletion: gone is done.
		{name: "delete: NotFound is success", call: del, noPod: true,
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"delete/"}},
		{name: "preempt: NotFound on the condition patch is success, and nothing is deleted", call: preempt, noPod: true,
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"patch/status"}},
		{
			name: "delete: a pod replaced under the same name is not deleted", call: del,
			after: replacePod,
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"delete/"},
			check: func(t *testing.T, api *fakeAPI, _ Result) {
				require.NotNil(t, api.pod("p"), "the newer pod stays")
				assert.Equal(t, types.UID("uid-newer"), api.pod("p").UID)
			},
		},
		{
			// The victim was replaced before its call ran: the condition
			// patch, fenced by the victim's UID, is refused (422) and the
			// call has met its goal — the victim is gone. The newer pod is
			// neither marked for disruption nor deleted.
			name: "preempt: a pod replaced under the same name is neither patched nor deleted", call: preempt,
			after: replacePod,
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"patch/status"},
			check: func(t *testing.T, api *fakeAPI, _ Result) {
				newer := api.pod("p")
				require.NotNil(t, newer, "the newer pod stays")
				assert.Equal(t, types.UID("uid-newer"), newer.UID)
				assert.Nil(t, findCondition(&newer.Status, v1.DisruptionTarget), "the condition landed on the newer pod")
			},
		},
		{
			// An unconditional status patch carries no resourceVersion, but
			// still the pod's UID: it never lands on a newer pod.
			name: "patch: unconditional, a pod replaced under the same name is not patched", call: func(p *v1.Pod) Call {
				return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes")}, Unconditional: true})
			},
			after: replacePod,
			state: dispatch.StateFailed, attempts: 1, reason: "permanent", requests: []string{"patch/status"},
			check: func(t *testing.T, api *fakeAPI, r Result) {
				assert.ErrorContains(t, r.Err, "the pod was replaced")
				assert.True(t, apierrors.IsInvalid(r.Err), "the server's answer is kept in the chain")
				assert.Nil(t, findCondition(&api.pod("p").Status, v1.PodScheduled), "the patch landed on the newer pod")
			},
		},
		{
			name: "preempt: a failed deletion is retried without patching the condition twice", call: preempt,
			fault: failFirst("delete/", apierrors.NewServiceUnavailable("down"), false),
			state: dispatch.StateSucceeded, attempts: 2, requests: []string{"patch/status", "delete/", "get/", "delete/"},
			check: func(t *testing.T, api *fakeAPI, _ Result) { assert.Nil(t, api.pod("p")) },
		},
		{
			name: "delete: lost response, the pod read back is gone", call: del,
			fault: failFirst("delete/", connReset(), true),
			state: dispatch.StateSucceeded, attempts: 1, requests: []string{"delete/", "get/"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pod := newPod("p")
				api := newFakeAPI()
				if !c.noPod {
					pod = api.add(pod)
				}
				d := newTestDispatcher(t, api, Options{})
				call := c.call(pod)
				if c.after != nil {
					c.after(api)
				}
				api.setFault(c.fault)
				r := outcome(t, submit(t, d, call))
				assert.Equal(t, c.state, r.State, "%v", r.Err)
				assert.Equal(t, c.attempts, r.Attempts)
				if c.state == dispatch.StateFailed {
					var re *dispatch.RetryError
					if assert.ErrorAs(t, r.Err, &re) {
						assert.Equal(t, c.reason, re.Reason)
					}
				}
				var kinds []string
				for _, q := range api.requests() {
					kinds = append(kinds, q.kind())
				}
				assert.Equal(t, c.requests, kinds)
				if c.check != nil {
					c.check(t, api, r)
				}
				closeD(t, d)
			})
		})
	}
}

// replacePod deletes pod p on the server and creates a newer pod under its
// name, with UID uid-newer.
func replacePod(api *fakeAPI) {
	newer := newPod("p")
	newer.UID = "uid-newer"
	api.add(newer)
}

// TestRetryAfterReachesTheBackoff: a 429 with Retry-After: 2 makes the
// dispatcher wait exactly 2s before the next attempt — the server's delay,
// not the default backoff — and the wait holds no worker: another pod's
// binding runs meanwhile on the only worker.
func TestRetryAfterReachesTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"), newPod("q"))
		obs := &retryLog{}
		d := newTestDispatcher(t, api, Options{Workers: 1, Observer: obs})
		api.setFault(failFirst("patch/status", apierrors.NewTooManyRequests("slow down", 2), false))
		start := time.Now()
		tp := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{NominatedNodeName: ptr("n1")}))
		synctest.Wait()
		tq := submit(t, d, Bind(api.pod("q"), "n1"))
		rq := outcome(t, tq)
		assert.Equal(t, dispatch.StateSucceeded, rq.State)
		assert.Equal(t, start, time.Now(), "the binding ran at once: the patch's wait held no worker")
		rp := outcome(t, tp)
		assert.Equal(t, dispatch.StateSucceeded, rp.State)
		assert.Equal(t, 2, rp.Attempts)
		reqs := api.requests()
		require.Len(t, reqs, 3)
		assert.Equal(t, 2*time.Second, reqs[2].At.Sub(reqs[0].At), "second patch exactly Retry-After later")
		ev := obs.get()
		require.Len(t, ev, 1)
		assert.Equal(t, retryEvent{Label: "pod_status_patch", Delay: 2 * time.Second, Err: ev[0].Err}, ev[0])
		assert.True(t, apierrors.IsTooManyRequests(ev[0].Err))
		closeD(t, d)
	})
}

// TestReadBackUsesOptionsClassify: the read a retry makes first (a
// binding reads its pod back) is judged by Options.Classify, as the call's
// own errors are — not by the package's Classify behind the user's back.
// A classifier that retries a Forbidden (RBAC not yet propagated, say)
// retries it on the read too; one that fails a 503 at once fails the call
// on the read's 503 instead of sending the binding again.
func TestReadBackUsesOptionsClassify(t *testing.T) {
	forbidden := apierrors.NewForbidden(podsResource, "p", errors.New("rbac not yet propagated"))
	unavailable := apierrors.NewServiceUnavailable("down")
	faults := func(readErr error) fault {
		return func(r request) (bool, error) {
			switch {
			case r.kind() == "create/binding" && r.N == 1:
				return false, apierrors.NewInternalError(errors.New("etcd"))
			case r.kind() == "get/" && r.N == 1:
				return false, readErr
			}
			return true, nil
		}
	}
	t.Run("a Forbidden the user retries", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			api := newFakeAPI(newPod("p"))
			d := newTestDispatcher(t, api, Options{Classify: func(err error) dispatch.Class {
				if apierrors.IsForbidden(err) {
					return dispatch.ClassRetry
				}
				return Classify(err)
			}})
			api.setFault(faults(forbidden))
			r := outcome(t, submit(t, d, Bind(api.pod("p"), "n1")))
			assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
			assert.Equal(t, "n1", api.pod("p").Spec.NodeName)
		})
	})
	t.Run("a 503 the user fails at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			api := newFakeAPI(newPod("p"))
			d := newTestDispatcher(t, api, Options{Classify: func(err error) dispatch.Class {
				if apierrors.IsServiceUnavailable(err) {
					return dispatch.ClassPermanent
				}
				return Classify(err)
			}})
			api.setFault(faults(unavailable))
			r := outcome(t, submit(t, d, Bind(api.pod("p"), "n1")))
			assert.Equal(t, dispatch.StateFailed, r.State)
			assert.True(t, apierrors.IsServiceUnavailable(r.Err), "%v", r.Err)
			assert.Equal(t, 1, api.count("create/binding"), "not sent again after the read's 503")
		})
	})
}

// TestReadBackHonoursRetryAfter: the read a retry makes first, answered
// with a 429 and Retry-After: 3, holds the call for the server's 3s, in the
// queue, before anything is sent again — as the write's own 429 does. A
// binding whose response was lost is read back again then, finds itself
// landed and is not sent twice; a conflicted status patch is re-read then
// and rebuilt; a deletion is read back again then, and finds the pod gone.
func TestReadBackHonoursRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write string // the write whose failure makes the retry read
		err   error  // its failure
		apply bool   // whether it landed all the same
		call  func(api *fakeAPI) Call
		sent  int // writes sent in all
	}{
		{"binding after a lost response", "create/binding", connReset(), true,
			func(api *fakeAPI) Call { return Bind(api.pod("p"), "n1") }, 1},
		{"conflicted status patch", "patch/status", nil, true,
			func(api *fakeAPI) Call {
				pod := api.pod("p")
				api.change("p", func(p *v1.Pod) { p.Status.Message = "someone else" })
				return PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("n1")})
			}, 2},
		{"deletion after a lost response", "delete/", connReset(), true,
			func(api *fakeAPI) Call { return Delete(api.pod("p"), nil) }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI(newPod("p"))
				c := tc.call(api)
				api.setFault(func(r request) (bool, error) {
					switch {
					case r.kind() == tc.write && r.N == 1 && tc.err != nil:
						return tc.apply, tc.err
					case r.kind() == "get/" && r.N == 1:
						return false, apierrors.NewTooManyRequests("slow down", 3)
					}
					return true, nil
				})
				d := newTestDispatcher(t, api, Options{Retry: dispatch.RetryPolicy{MaxAttempts: 5}})
				r := outcome(t, submit(t, d, c))
				assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
				reqs := api.requests()
				i := slices.IndexFunc(reqs, func(r request) bool { return r.kind() == "get/" })
				require.True(t, i >= 0 && i+1 < len(reqs), "%v", reqs)
				assert.Equal(t, 3*time.Second, reqs[i+1].At.Sub(reqs[i].At), "the next request came before the read's Retry-After: %v", reqs)
				assert.Equal(t, tc.sent, api.count(tc.write), "%v", reqs)
			})
		})
	}
}

// TestBindingMergedIntoALostBinding: a binding whose response was lost
// (it landed) is retried; a second binding of the pod, submitted while the
// first waits out its backoff or while it is in flight, meets the retry.
// The pod is bound once, by the first, whose submitter hears it succeeded
// (it used to end Failed, "bound to node n1", when the second was to
// another node). A second binding to the same node succeeds with it; one to
// another node gets the conflict it would get on its own: refused at once
// by Submit onto the retry, or Failed once it runs behind it.
func TestBindingMergedIntoALostBinding(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     string // the second binding's
		inFlight bool   // the second arrives while the first is in flight
		seen     bool   // the second is built from the pod as bound
	}{
		{"same node", "n1", false, false},
		{"same node, from the bound view", "n1", false, true},
		{"same node, in flight", "n1", true, false},
		{"another node", "n2", false, false},
		{"another node, from the bound view", "n2", false, true},
		{"another node, in flight", "n2", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI(newPod("p"))
				api.setFault(failFirst("create/binding", connReset(), true))
				d := newTestDispatcher(t, api, Options{Retry: dispatch.RetryPolicy{InitialBackoff: time.Minute, Jitter: dispatch.JitterNone}})
				unbound := api.pod("p")
				release := func() {}
				if tc.inFlight {
					release = api.hold("create/binding", "p")
				}
				first := submit(t, d, Bind(unbound, "n1"))
				synctest.Wait() // in flight, or landed with its response lost and waiting out its backoff
				view := unbound
				if tc.seen {
					view = api.pod("p")
				}
				second, err := d.Submit(context.Background(), Bind(view, tc.node), SubmitOptions{})
				release()
				r1 := outcome(t, first)
				assert.Equal(t, dispatch.StateSucceeded, r1.State, "the first binding landed: %v", r1.Err)
				assert.Equal(t, "n1", api.pod("p").Spec.NodeName)
				switch {
				case tc.node == "n1":
					require.NoError(t, err)
					r2 := outcome(t, second)
					assert.Equal(t, dispatch.StateSucceeded, r2.State, "%v", r2.Err)
					assert.Equal(t, 1, api.count("create/binding"), "bound once")
				case !tc.inFlight:
					assert.ErrorIs(t, err, dispatch.ErrMergeRejected)
					assert.True(t, apierrors.IsConflict(err), "%v", err)
					assert.Equal(t, 1, api.count("create/binding"), "bound once")
				default:
					require.NoError(t, err)
					r2 := outcome(t, second)
					assert.Equal(t, dispatch.StateFailed, r2.State)
					assert.True(t, apierrors.IsConflict(r2.Err), "%v", r2.Err)
				}
			})
		})
	}
}

// TestReadBackTellsTheSuccessor: a write whose response was lost, found
// landed by the read its retry makes first, tells the call that waited
// behind it what it did, as a write that lands with its response does. An
// Unconditional PodScheduled=False built before the binding landed is
// dropped as stale, not written onto the bound pod (kubernetes#139602); a
// status patch behind a deletion that landed ends Skipped, not sent to
// fail NotFound.
func TestReadBackTellsTheSuccessor(t *testing.T) {
	schedAnyway := func(p *v1.Pod) Call {
		return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes are available")}, Unconditional: true})
	}
	for _, tc := range []struct {
		name  string
		write string
		first func(p *v1.Pod) Call
	}{
		{"binding", "create/binding", func(p *v1.Pod) Call { return Bind(p, "n1") }},
		{"deletion", "delete/", func(p *v1.Pod) Call { return Delete(p, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI(newPod("p"))
				api.setFault(failFirst(tc.write, connReset(), true))
				d := newTestDispatcher(t, api, Options{})
				release := api.hold(tc.write, "p")
				first := submit(t, d, tc.first(api.pod("p")))
				synctest.Wait() // in flight
				patch := submit(t, d, schedAnyway(api.pod("p")))
				release()
				r1, r2 := outcome(t, first), outcome(t, patch)
				assert.Equal(t, dispatch.StateSucceeded, r1.State, "%v", r1.Err)
				assert.Equal(t, dispatch.StateSkipped, r2.State, "%v", r2.Err)
				assert.Zero(t, api.count("patch/status"), "%v", api.requests())
				if p := api.pod("p"); p != nil {
					assert.False(t, scheduledFalse(p), "a bound pod never says PodScheduled=False")
				}
			})
		})
	}
}

// TestBindingRefusedForGoodIsNotResent: kube-apiserver answers a binding
// with 409 not only when the pod is bound already, but when it is being
// deleted or still has scheduling gates; the pod read back is unbound
// then, and binding it again is refused the same way. The call ends
// Failed after the read, with the server's answer, instead of spending
// its every attempt on a binding that cannot land.
func TestBindingRefusedForGoodIsNotResent(t *testing.T) {
	for name, change := range map[string]func(p *v1.Pod){
		"being deleted": func(p *v1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now },
		"gated":         func(p *v1.Pod) { p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "example.com/quota"}} },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI()
				pod := api.add(newPod("p"))
				api.change("p", change)
				d := newTestDispatcher(t, api, Options{Retry: dispatch.RetryPolicy{MaxAttempts: 5}})
				r := outcome(t, submit(t, d, Bind(pod, "n1")))
				assert.Equal(t, dispatch.StateFailed, r.State)
				assert.Equal(t, 1, r.Attempts)
				assert.True(t, apierrors.IsConflict(r.Err), "the server's answer is kept in the chain: %v", r.Err)
				var re *dispatch.RetryError
				if assert.ErrorAs(t, r.Err, &re) {
					assert.Equal(t, "before_retry", re.Reason)
				}
				assert.Equal(t, 1, api.count("create/binding"), "a binding the server refuses for good is sent once")
				assert.Empty(t, api.pod("p").Spec.NodeName)
			})
		})
	}
}

// TestDeletionFoundTerminatingIsNotResent: a deletion whose response was
// lost reads the pod back before it runs again, "so that no write happens
// twice". A pod with a grace period is not gone at once: the DELETE that
// landed left it terminating (deletionTimestamp set), which the read
// shows. The deletion has landed: the call ends Succeeded without a second
// DELETE, and the call waiting behind it is told the pod is gone.
func TestDeletionFoundTerminatingIsNotResent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		api.setFault(func(r request) (bool, error) {
			if r.kind() == "delete/" && r.N == 1 {
				// Graceful: the server marks the pod, and the response is
				// lost. The fault runs under the server's lock.
				p := api.store.pods["p"]
				now := metav1.Now()
				p.DeletionTimestamp = &now
				api.store.bump(p)
				return false, connReset()
			}
			return true, nil
		})
		d := newTestDispatcher(t, api, Options{})
		release := api.hold("delete/", "p")
		del := submit(t, d, Delete(api.pod("p"), nil))
		synctest.Wait() // in flight: the patch below waits behind it
		patch := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes")}}))
		release()
		r := outcome(t, del)
		assert.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
		assert.Equal(t, 1, api.count("delete/"), "the DELETE that landed is not sent again")
		assert.Equal(t, dispatch.StateSkipped, outcome(t, patch).State, "the pod is being deleted: nothing left to do behind it")
		assert.Zero(t, api.count("patch/status"))
	})
}

// TestDeletionOfATerminatingPodIsNotSent: as upstream's preemption skips
// a victim whose graceful deletion has started ("Sending another API call
// is unnecessary"), a deletion built from a pod with a deletionTimestamp —
// or whose baseline SyncObject refreshes to one — sends nothing: no
// condition patch, no DELETE. It ends Skipped, which counts as success, and
// SyncObject does not show a condition that will never be written.
func TestDeletionOfATerminatingPodIsNotSent(t *testing.T) {
	disrupt := &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
	terminate := func(p *v1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		victim := api.change("p", terminate)
		d := newTestDispatcher(t, api, Options{})
		assert.Equal(t, dispatch.StateSkipped, outcome(t, submit(t, d, Delete(victim, disrupt))).State)
		assert.Empty(t, api.requests(), "nothing sent")
	})
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"), newPod("q"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("create/binding", "q")
		bind := submit(t, d, Bind(api.pod("q"), "n1"))
		synctest.Wait() // the only worker is held
		del := submit(t, d, Delete(api.pod("p"), disrupt))
		pod, err := d.SyncObject(api.change("p", terminate))
		require.NoError(t, err)
		assert.Nil(t, findCondition(&pod.Status, v1.DisruptionTarget), "SyncObject shows no condition that will not be written")
		release()
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, bind).State)
		assert.Equal(t, dispatch.StateSkipped, outcome(t, del).State)
		assert.Zero(t, api.count("delete/"))
		assert.Zero(t, api.count("patch/status"))
	})
}
