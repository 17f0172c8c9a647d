package kube

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"
)

// TestCoalescing is the merge / skip / overwrite / successor table of the
// three calls through a real dispatcher and the fake API server: what each
// submission's ticket says, which requests reach the server for the pod,
// and what the pod looks like at the end. Each call is built from the pod
// as the server has it at that moment, as a scheduler builds it from its
// informer. Calls are either all pending (the only worker is held by
// another pod) or the first is in flight (held at the server) and the rest
// arrive behind it. The first rows are upstream's call_queue_test.go
// cases.
func TestCoalescing(t *testing.T) {
	sched := func(p *v1.Pod) Call {
		return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes are available")}})
	}
	schedAnyway := func(p *v1.Pod) Call {
		return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes are available")}, Unconditional: true})
	}
	probeAnyway := func(p *v1.Pod) Call {
		return PatchStatus(p, StatusPatch{Conditions: []v1.PodCondition{{Type: "example.com/Probe", Status: v1.ConditionTrue}}, Unconditional: true})
	}
	nominate := func(node string) func(p *v1.Pod) Call {
		return func(p *v1.Pod) Call { return PatchStatus(p, StatusPatch{NominatedNodeName: ptr(node)}) }
	}
	bind := func(node string) func(p *v1.Pod) Call { return func(p *v1.Pod) Call { return Bind(p, node) } }
	del := func(p *v1.Pod) Call {
		return Delete(p, &v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler})
	}
	scheduledFalse := func(p *v1.Pod) bool {
		c := findCondition(&p.Status, v1.PodScheduled)
		return c != nil && c.Status == v1.ConditionFalse
	}
	const (
		ok      = dispatch.StateSucceeded
		skipped = dispatch.StateSkipped
	)
	cases := []struct {
		name     string
		inFlight bool // the first call is in flight when the others arrive
		calls    []func(*v1.Pod) Call
		// skippedAtOnce lists the submissions that end Skipped before
		// anything runs (a less relevant call onto a pending one).
		skippedAtOnce []int
		want          []dispatch.State
		requests      []string
		// between, if set, runs once every call is submitted, before any
		// is let through.
		between func(api *fakeAPI)
		check   func(t *testing.T, p *v1.Pod)
	}{
		{
			name: "more relevant call overwrites", calls: []func(*v1.Pod) Call{sched, bind("n1")},
			want: []dispatch.State{ok, ok}, requests: []string{"create/binding"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.Equal(t, "n1", p.Spec.NodeName)
				assert.False(t, scheduledFalse(p), "the overwritten patch never ran")
			},
		},
		{
			name: "less relevant call is skipped at once", calls: []func(*v1.Pod) Call{bind("n1"), sched},
			skippedAtOnce: []int{1}, want: []dispatch.State{ok, skipped}, requests: []string{"create/binding"},
			check: func(t *testing.T, p *v1.Pod) { assert.False(t, scheduledFalse(p)) },
		},
		{
			name: "same type merges into one write", calls: []func(*v1.Pod) Call{sched, nominate("n2")},
			want: []dispatch.State{ok, ok}, requests: []string{"patch/status"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.True(t, scheduledFalse(p))
				assert.Equal(t, "n2", p.Status.NominatedNodeName)
			},
		},
		{
			name: "a merge that leaves nothing to change is skipped", calls: []func(*v1.Pod) Call{nominate("n2"), nominate("")},
			want: []dispatch.State{skipped, skipped}, requests: nil,
			check: func(t *testing.T, p *v1.Pod) { assert.Empty(t, p.Status.NominatedNodeName) },
		},
		{
			name: "a patch that changes nothing is never sent", calls: []func(*v1.Pod) Call{nominate("")},
			want: []dispatch.State{skipped}, requests: nil,
		},
		{
			name: "deletion overwrites a pending binding", calls: []func(*v1.Pod) Call{bind("n1"), del},
			want: []dispatch.State{ok, ok}, requests: []string{"patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p, "deleted") },
		},
		{
			name: "deletion overwrites a pending status patch", calls: []func(*v1.Pod) Call{sched, del},
			want: []dispatch.State{ok, ok}, requests: []string{"patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p) },
		},
		{
			name: "binding onto a pending deletion is skipped", calls: []func(*v1.Pod) Call{del, bind("n1")},
			skippedAtOnce: []int{1}, want: []dispatch.State{ok, skipped}, requests: []string{"patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p) },
		},
		{
			name: "status patch onto a pending deletion is skipped", calls: []func(*v1.Pod) Call{del, sched, nominate("n1")},
			skippedAtOnce: []int{1, 2}, want: []dispatch.State{ok, skipped, skipped}, requests: []string{"patch/status", "delete/"},
		},
		{
			name: "newer binding replaces a pending one", calls: []func(*v1.Pod) Call{bind("n1"), bind("n2")},
			want: []dispatch.State{ok, ok}, requests: []string{"create/binding"},
			check: func(t *testing.T, p *v1.Pod) { assert.Equal(t, "n2", p.Spec.NodeName) },
		},
		{
			name: "three patches, one write", calls: []func(*v1.Pod) Call{nominate("n1"), sched, nominate("n3")},
			want: []dispatch.State{ok, ok, ok}, requests: []string{"patch/status"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.True(t, scheduledFalse(p))
				assert.Equal(t, "n3", p.Status.NominatedNodeName)
			},
		},

		// In flight: the call on the wire is never merged with; a new call
		// waits behind it as the successor (kubernetes#135180), and the
		// successor coalesces as a pending call does.
		{
			name: "a binding waits behind an in-flight status patch", inFlight: true, calls: []func(*v1.Pod) Call{sched, bind("n1")},
			want: []dispatch.State{ok, ok}, requests: []string{"patch/status", "create/binding"},
			check: func(t *testing.T, p *v1.Pod) { assert.Equal(t, "n1", p.Spec.NodeName) },
		},
		{
			name: "successors coalesce behind an in-flight patch", inFlight: true, calls: []func(*v1.Pod) Call{sched, nominate("n1"), nominate("n2")},
			want: []dispatch.State{ok, ok, ok}, requests: []string{"patch/status", "patch/status"},
			check: func(t *testing.T, p *v1.Pod) { assert.Equal(t, "n2", p.Status.NominatedNodeName) },
		},
		{
			name: "a deletion waits behind an in-flight binding", inFlight: true, calls: []func(*v1.Pod) Call{bind("n1"), del},
			want: []dispatch.State{ok, ok}, requests: []string{"create/binding", "patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p) },
		},
		{
			// kubernetes#139602: a PodScheduled=False built before the bind
			// landed is stale once it has: the binding's success drops it
			// from its successor, which is left with nothing to write.
			name: "a stale PodScheduled=False behind an in-flight binding never lands", inFlight: true,
			calls: []func(*v1.Pod) Call{bind("n1"), schedAnyway},
			want:  []dispatch.State{ok, skipped}, requests: []string{"create/binding"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.Equal(t, "n1", p.Spec.NodeName)
				assert.False(t, scheduledFalse(p), "bound pods never say PodScheduled=False")
			},
		},
		{
			// The pod is gone once the deletion lands: what waited behind
			// it is moot, as it is onto a pending deletion — not sent to
			// fail NotFound (and a status patch logged as an error).
			name: "a status patch behind an in-flight deletion is moot once it lands", inFlight: true,
			calls: []func(*v1.Pod) Call{del, sched, nominate("n1")},
			want:  []dispatch.State{ok, skipped, skipped}, requests: []string{"patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p, "deleted") },
		},
		{
			name: "a binding behind an in-flight deletion is moot once it lands", inFlight: true,
			calls: []func(*v1.Pod) Call{del, bind("n1")},
			want:  []dispatch.State{ok, skipped}, requests: []string{"patch/status", "delete/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Nil(t, p, "deleted") },
		},
		{
			name: "a duplicate binding behind an in-flight one is moot once it lands", inFlight: true,
			calls: []func(*v1.Pod) Call{bind("n1"), bind("n1")},
			want:  []dispatch.State{ok, skipped}, requests: []string{"create/binding"},
			check: func(t *testing.T, p *v1.Pod) { assert.Equal(t, "n1", p.Spec.NodeName) },
		},
		{
			// A binding to another node behind it is refused by the server,
			// and fails once the pod is read back on the first node.
			name: "a binding to another node behind an in-flight one fails", inFlight: true,
			calls: []func(*v1.Pod) Call{bind("n1"), bind("n2")},
			want:  []dispatch.State{ok, dispatch.StateFailed}, requests: []string{"create/binding", "create/binding", "get/"},
			check: func(t *testing.T, p *v1.Pod) { assert.Equal(t, "n1", p.Spec.NodeName) },
		},
		{
			// The same race with a bind the dispatcher did not make (another
			// scheduler, an earlier attempt): the patch carries the pod's
			// old resourceVersion, the server refuses it, the pod is read
			// back bound, and the stale condition is dropped.
			name:  "a pod bound behind the dispatcher's back refuses the stale patch",
			calls: []func(*v1.Pod) Call{sched}, between: bindBehindTheBack,
			want: []dispatch.State{skipped}, requests: []string{"patch/status", "get/"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.Equal(t, "elsewhere", p.Spec.NodeName)
				assert.False(t, scheduledFalse(p))
			},
		},
		{
			// An Unconditional patch merged with a pending conditional one
			// does not strip the pending one's precondition: its stale
			// PodScheduled=False is refused with it, and dropped once the
			// pod is read back bound; the Unconditional patch's own
			// condition is written.
			name:  "a merge with an Unconditional patch keeps the pending patch's precondition",
			calls: []func(*v1.Pod) Call{sched, probeAnyway}, between: bindBehindTheBack,
			want: []dispatch.State{ok, ok}, requests: []string{"patch/status", "get/", "patch/status"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.Equal(t, "elsewhere", p.Spec.NodeName)
				assert.False(t, scheduledFalse(p), "the race kubernetes#139602 fixed")
				assert.NotNil(t, findCondition(&p.Status, "example.com/Probe"), "the Unconditional patch's condition is written")
			},
		},
		{
			// What the precondition prevents: the same patch sent
			// Unconditional lands on the bound pod.
			name:  "without the precondition the stale condition lands",
			calls: []func(*v1.Pod) Call{schedAnyway}, between: bindBehindTheBack,
			want: []dispatch.State{ok}, requests: []string{"patch/status"},
			check: func(t *testing.T, p *v1.Pod) {
				assert.Equal(t, "elsewhere", p.Spec.NodeName)
				assert.True(t, scheduledFalse(p), "the race kubernetes#139602 fixed")
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI(newPod("p"), newPod("blocker"))
				d := newTestDispatcher(t, api, Options{Workers: 1})
				var release func()
				if c.inFlight {
					kind := map[CallType]string{PodStatusPatch: "patch/status", PodBinding: "create/binding", PodDeletion: "patch/status"}
					release = api.hold(kind[c.calls[0](api.pod("p")).Type()], "p")
				} else {
					release = api.hold("patch/status", "blocker")
					submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
				}
				synctest.Wait()
				tickets := make([]*Ticket, len(c.calls))
				for i, mk := range c.calls {
					tickets[i] = submit(t, d, mk(api.pod("p")))
					if i == 0 {
						synctest.Wait() // in flight, if it can be
					}
				}
				synctest.Wait()
				for i, tk := range tickets {
					r, done := tk.Result()
					if assert.Equal(t, contains(c.skippedAtOnce, i), done, "submission %d ended before anything ran", i) && done {
						assert.Equal(t, dispatch.StateSkipped, r.State)
						assert.Zero(t, r.Attempts)
					}
				}
				if c.between != nil {
					c.between(api)
				}
				release()
				for i, tk := range tickets {
					assert.Equal(t, c.want[i], outcome(t, tk).State, "submission %d", i)
				}
				var got []string
				for _, r := range api.requests() {
					if r.Name == "p" {
						got = append(got, r.kind())
					}
				}
				assert.Equal(t, c.requests, got, "requests for the pod")
				if c.check != nil {
					c.check(t, api.pod("p"))
				}
				closeD(t, d)
			})
		})
	}
}

// bindBehindTheBack binds pod p on the server without a request through
// the dispatcher.
func bindBehindTheBack(api *fakeAPI) {
	api.change("p", func(p *v1.Pod) { p.Spec.NodeName = "elsewhere" })
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestSkippedSubmissionDoesNotRaisePriority: a status patch skipped onto a
// pending binding neither joins it nor lends it its priority or deadline;
// the binding runs as it was.
func TestSkippedSubmissionDoesNotRaisePriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"), newPod("q"), newPod("blocker"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("patch/status", "blocker")
		submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
		synctest.Wait()
		bq := submit(t, d, Bind(api.pod("q"), "n1"))
		bp, err := d.Submit(t.Context(), Bind(api.pod("p"), "n1"), SubmitOptions{Priority: new(1)})
		require.NoError(t, err)
		sk, err := d.Submit(t.Context(), PatchStatus(api.pod("p"), StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{Priority: new(100)})
		require.NoError(t, err)
		assert.Equal(t, dispatch.StateSkipped, outcome(t, sk).State)
		release()
		outcome(t, bq)
		outcome(t, bp)
		var order []string
		for _, r := range api.requests() {
			if r.Verb == "create" {
				order = append(order, r.Name)
			}
		}
		assert.Equal(t, []string{"q", "p"}, order, "p's binding kept its priority 1 < q's 10")
		s := closeD(t, d)
		assert.Equal(t, 1, int(s.Outcomes[dispatch.StateSkipped]))
	})
}

// TestMergeKeepsTheNewerBaseline pins that two status patches combine into
// one write, the newer one's fields winning, even when the pending patch's
// baseline is newer than the incoming one's: a patch rebased onto the
// response of the write before it, then merged with a patch built from an
// informer that has not seen that write yet, is judged against the pod as
// it now is. Judged against the older view, the merged patch — which clears
// the nomination the first write set — would change nothing, end Skipped
// and never be sent.
func TestMergeKeepsTheNewerBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sched := unschedulable("0/3 nodes")
		pod := newPod("p")
		pod.Status.Conditions = []v1.PodCondition{sched}
		api := newFakeAPI(pod)
		view := api.pod("p") // the informer's view, which stays behind
		// A token every 10s: the second patch, rebased once the first
		// lands, waits for its token while the third comes in.
		d := newTestDispatcher(t, api, Options{Workers: 2, RateLimit: rate.NewLimiter(rate.Every(10*time.Second), 1)})
		release := api.hold("patch/status", "p")

		t1 := submit(t, d, PatchStatus(view, StatusPatch{NominatedNodeName: ptr("nodeA")}))
		synctest.Wait() // held at the server
		t2 := submit(t, d, PatchStatus(view, StatusPatch{NominatedNodeName: ptr("")}))
		release()
		require.Equal(t, dispatch.StateSucceeded, outcome(t, t1).State)
		synctest.Wait() // the second patch is rebased onto the first's response
		t3 := submit(t, d, PatchStatus(view, StatusPatch{Conditions: []v1.PodCondition{sched}}))

		assert.Equal(t, dispatch.StateSucceeded, outcome(t, t2).State)
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, t3).State)
		assert.Equal(t, 2, api.count("patch/status"))
		assert.Empty(t, api.pod("p").Status.NominatedNodeName, "the later patches cleared the nomination")
	})
}

// TestMergeIntoABoundViewDropsTheStaleReport: a status patch built while
// the pod was unbound (PodScheduled=False, a nomination) is pending when
// the pod is bound by another writer, and a status patch built from the
// informer's new, bound view merges with it. The merged patch carries the
// bound view's resourceVersion, so the server accepts whatever it says:
// the stale PodScheduled=False and nomination are dropped from it, as they
// are when SyncObject or a write's response shows the pod bound
// (kubernetes#139602), and only the newer patch's own condition lands.
func TestMergeIntoABoundViewDropsTheStaleReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"), newPod("q"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("patch/status", "q")
		other := submit(t, d, PatchStatus(api.pod("q"), StatusPatch{NominatedNodeName: ptr("n9")}))
		synctest.Wait() // the only worker is held by q's patch

		stale := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/3 nodes")}, NominatedNodeName: ptr("n2")}))
		bound := api.change("p", func(p *v1.Pod) {
			p.Spec.NodeName = "n1"
			p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}
		})
		probe := v1.PodCondition{Type: "example.com/Probe", Status: v1.ConditionTrue}
		fresh := submit(t, d, PatchStatus(bound, StatusPatch{Conditions: []v1.PodCondition{probe}}))
		release()

		require.Equal(t, dispatch.StateSucceeded, outcome(t, other).State)
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, stale).State)
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, fresh).State)
		got := api.pod("p")
		sched := findCondition(&got.Status, v1.PodScheduled)
		require.NotNil(t, sched)
		assert.Equal(t, v1.ConditionTrue, sched.Status, "a bound pod is not reported unschedulable")
		assert.Empty(t, got.Status.NominatedNodeName, "a bound pod is not nominated")
		assert.NotNil(t, findCondition(&got.Status, probe.Type), "the newer patch's own condition lands")
	})
}

// TestBindingReplacedByADeletion: a deletion replaces a pending binding,
// and the binding's submitter shares the deletion's outcome, as every
// submission merged into a call does: Succeeded, though the pod was never
// bound — it is deleted. Its Result's Call is the deletion, which tells a
// binding a deletion replaced from one that landed.
func TestBindingReplacedByADeletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"), newPod("blocker"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("patch/status", "blocker")
		submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
		synctest.Wait()
		bind := submit(t, d, Bind(api.pod("p"), "n1"))
		del := submit(t, d, Delete(api.pod("p"), nil))
		release()
		rb, rd := outcome(t, bind), outcome(t, del)
		assert.Equal(t, dispatch.StateSucceeded, rb.State)
		assert.Equal(t, rd.Outcome, rb.Outcome, "one call, one outcome")
		assert.Equal(t, PodDeletion, rb.Call.Type(), "the call that ran is the deletion")
		assert.Empty(t, rb.Call.Node())
		assert.Nil(t, api.pod("p"), "deleted, never bound")
	})
}
