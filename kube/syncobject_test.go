package kube

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"
)

// syncFixture is a dispatcher whose only worker is held by another pod, so
// that calls for pod p stay pending until release.
type syncFixture struct {
	api     *fakeAPI
	d       *Dispatcher
	release func()
}

func newSyncFixture(t *testing.T) *syncFixture {
	api := newFakeAPI(newPod("p"), newPod("blocker"))
	d := newTestDispatcher(t, api, Options{Workers: 1})
	release := api.hold("patch/status", "blocker")
	submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
	synctest.Wait()
	return &syncFixture{api, d, release}
}

// update changes pod p on the server as another writer would, and returns
// the pod as an informer would then deliver it.
func (f *syncFixture) update(change func(p *v1.Pod)) *v1.Pod {
	return f.api.change("p", change)
}

func (f *syncFixture) requestsFor(name string) []string {
	var out []string
	for _, r := range f.api.requests() {
		if r.Name == name {
			out = append(out, r.kind())
		}
	}
	return out
}

// TestSyncObject: SyncObject shows a pod as it will be once its pending
// call lands, and makes the pod the call's new baseline — which can make
// the call moot (Skipped at once) or spare it a conflict with the server.
func TestSyncObject(t *testing.T) {
	sched := unschedulable("0/3 nodes are available")

	t.Run("nothing pending: the pod itself", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			pod := f.api.pod("p")
			got, err := f.d.SyncObject(pod)
			require.NoError(t, err)
			assert.Same(t, pod, got)
			f.release()
		})
	})

	t.Run("pending status patch: projected, input untouched, still pending", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			tk := submit(t, f.d, PatchStatus(f.api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{sched}, NominatedNodeName: ptr("n2")}))
			pod := f.api.pod("p")
			got, err := f.d.SyncObject(pod)
			require.NoError(t, err)
			assert.NotSame(t, pod, got)
			assert.Empty(t, pod.Status.Conditions, "the input is never written")
			c := findCondition(&got.Status, v1.PodScheduled)
			require.NotNil(t, c)
			assert.Equal(t, sched.Message, c.Message)
			assert.False(t, c.LastTransitionTime.IsZero())
			assert.Equal(t, "n2", got.Status.NominatedNodeName)
			assert.True(t, f.d.Busy(pod.UID))
			f.release()
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
			assert.Equal(t, "n2", f.api.pod("p").Status.NominatedNodeName)
		})
	})

	t.Run("the newer view makes the pending patch moot: Skipped at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			tk := submit(t, f.d, PatchStatus(f.api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{sched}}))
			seen := f.update(func(p *v1.Pod) { p.Status.Conditions = []v1.PodCondition{sched} }) // another writer got there first
			got, err := f.d.SyncObject(seen)
			require.NoError(t, err)
			assert.Same(t, seen, got, "nothing left to project")
			r, done := tk.Result()
			require.True(t, done, "ended without waiting for a worker")
			assert.Equal(t, dispatch.StateSkipped, r.State)
			assert.False(t, f.d.Busy(seen.UID))
			f.release()
			assert.Empty(t, f.requestsFor("p"), "never sent")
		})
	})

	t.Run("the newer resourceVersion spares the patch a conflict", func(t *testing.T) {
		for _, synced := range []bool{false, true} {
			synctest.Test(t, func(t *testing.T) {
				f := newSyncFixture(t)
				tk := submit(t, f.d, PatchStatus(f.api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{sched}}))
				seen := f.update(func(p *v1.Pod) { p.Labels = map[string]string{"app": "x"} })
				if synced {
					_, err := f.d.SyncObject(seen)
					require.NoError(t, err)
				}
				f.release()
				assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
				if synced {
					assert.Equal(t, []string{"patch/status"}, f.requestsFor("p"))
				} else {
					assert.Equal(t, []string{"patch/status", "get/", "patch/status"}, f.requestsFor("p"), "refused, read back, resent")
				}
			})
		}
	})

	t.Run("a bound pod makes a pending PodScheduled=False stale", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			tk := submit(t, f.d, PatchStatus(f.api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{sched}, NominatedNodeName: ptr("n2")}))
			seen := f.update(func(p *v1.Pod) { p.Spec.NodeName = "n1" })
			got, err := f.d.SyncObject(seen)
			require.NoError(t, err)
			assert.Nil(t, findCondition(&got.Status, v1.PodScheduled))
			assert.Empty(t, got.Status.NominatedNodeName)
			assert.Equal(t, dispatch.StateSkipped, outcome(t, tk).State)
			f.release()
			assert.Empty(t, f.requestsFor("p"))
		})
	})

	t.Run("pending binding: projected onto its node; moot once the pod is there", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			tk := submit(t, f.d, Bind(f.api.pod("p"), "n1"))
			got, err := f.d.SyncObject(f.api.pod("p"))
			require.NoError(t, err)
			assert.Equal(t, "n1", got.Spec.NodeName)
			_, done := tk.Result()
			assert.False(t, done)

			seen := f.update(func(p *v1.Pod) { p.Spec.NodeName = "n1" }) // an earlier attempt's bind, seen late
			got, err = f.d.SyncObject(seen)
			require.NoError(t, err)
			assert.Same(t, seen, got)
			assert.Equal(t, dispatch.StateSkipped, outcome(t, tk).State)
			f.release()
			assert.Empty(t, f.requestsFor("p"))
		})
	})

	t.Run("pending binding, the pod bound elsewhere: shown where the server has it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			tk := submit(t, f.d, Bind(f.api.pod("p"), "n1"))
			seen := f.update(func(p *v1.Pod) { p.Spec.NodeName = "n2" }) // another scheduler's binding
			got, err := f.d.SyncObject(seen)
			require.NoError(t, err)
			assert.Same(t, seen, got, "the server's truth wins over a binding that cannot land")
			f.release()
			r := outcome(t, tk)
			assert.Equal(t, dispatch.StateFailed, r.State)
			assert.ErrorContains(t, r.Err, "bound to node n2")
			assert.Equal(t, "n2", f.api.pod("p").Spec.NodeName)
		})
	})

	t.Run("pending deletion: its condition is projected", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			cond := v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
			tk := submit(t, f.d, Delete(f.api.pod("p"), &cond))
			got, err := f.d.SyncObject(f.api.pod("p"))
			require.NoError(t, err)
			assert.NotNil(t, findCondition(&got.Status, v1.DisruptionTarget))
			f.release()
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		})
	})

	t.Run("in flight: never rewritten; its successor is", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			api := newFakeAPI(newPod("p"))
			d := newTestDispatcher(t, api, Options{})
			release := api.hold("create/binding", "p")
			bind := submit(t, d, Bind(api.pod("p"), "n1"))
			synctest.Wait()
			pod := api.pod("p")
			got, err := d.SyncObject(pod)
			require.NoError(t, err)
			assert.Same(t, pod, got, "a call in flight may be taking effect: not projected")

			patch := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{{Type: "example.com/Ready", Status: v1.ConditionTrue}}}))
			got, err = d.SyncObject(pod)
			require.NoError(t, err)
			assert.NotNil(t, findCondition(&got.Status, "example.com/Ready"), "the successor is pending: projected")
			release()
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, bind).State)
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, patch).State)
		})
	})

	t.Run("bad input", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newSyncFixture(t)
			_, err := f.d.SyncObject(nil)
			assert.ErrorContains(t, err, "pod is nil")
			noUID := &v1.Pod{}
			got, err := f.d.SyncObject(noUID)
			require.NoError(t, err)
			assert.Same(t, noUID, got)
			f.release()
		})
	})
}

// TestSyncObjectKeepsTheNewerBaseline pins that SyncObject does not rebase
// a pending status patch onto a pod older than the baseline the patch
// already holds — the response of the write before it, which the informer
// has not delivered yet — as merge does not (TestMergeKeepsTheNewerBaseline).
// Rebased onto the older view, a patch could find nothing to change that
// the pod as it now is needs, and end Skipped unsent; or carry the older
// resourceVersion as its precondition and be refused, read back and sent
// again. Either way the pod given is the one projected: it is what the
// caller holds.
func TestSyncObjectKeepsTheNewerBaseline(t *testing.T) {
	ready := v1.PodCondition{Type: "example.com/Ready", Status: v1.ConditionTrue}
	for _, c := range []struct {
		name   string
		p      StatusPatch                        // the pending patch, built from the informer's view
		got    func(t *testing.T, got *v1.Pod)    // the informer's view, projected
		server func(t *testing.T, server *v1.Pod) // once the pending patch has landed
	}{
		{
			name: "a patch the older view finds moot is still sent",
			p:    StatusPatch{NominatedNodeName: ptr("")},
			got:  func(t *testing.T, got *v1.Pod) { assert.Empty(t, got.Status.NominatedNodeName) },
			server: func(t *testing.T, server *v1.Pod) {
				assert.Empty(t, server.Status.NominatedNodeName, "the pending patch cleared the nomination the first one set")
			},
		},
		{
			name: "a patch keeps the newer resourceVersion as its precondition",
			p:    StatusPatch{Conditions: []v1.PodCondition{ready}},
			got: func(t *testing.T, got *v1.Pod) {
				assert.NotNil(t, findCondition(&got.Status, ready.Type))
				assert.Empty(t, got.Status.NominatedNodeName, "the pod given, projected: not the newer baseline")
			},
			server: func(t *testing.T, server *v1.Pod) {
				assert.NotNil(t, findCondition(&server.Status, ready.Type))
				assert.Equal(t, "nodeA", server.Status.NominatedNodeName)
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI(newPod("p"))
				view := api.pod("p") // the informer's view, which stays behind
				// A token every 10s: the second patch, rebased once the
				// first lands, waits for its token while SyncObject comes.
				d := newTestDispatcher(t, api, Options{Workers: 2, RateLimit: rate.NewLimiter(rate.Every(10*time.Second), 1)})
				release := api.hold("patch/status", "p")

				t1 := submit(t, d, PatchStatus(view, StatusPatch{NominatedNodeName: ptr("nodeA")}))
				synctest.Wait() // held at the server
				t2 := submit(t, d, PatchStatus(view, c.p))
				release()
				require.Equal(t, dispatch.StateSucceeded, outcome(t, t1).State)
				synctest.Wait() // the second patch is rebased onto the first's response

				got, err := d.SyncObject(view) // an informer event from before the first write
				require.NoError(t, err)
				_, done := t2.Result()
				assert.False(t, done, "still pending")
				c.got(t, got)

				assert.Equal(t, dispatch.StateSucceeded, outcome(t, t2).State)
				assert.Equal(t, 2, api.count("patch/status"), "each patch sent once")
				assert.Zero(t, api.count("get/"), "nothing refused and read back")
				c.server(t, api.pod("p"))
			})
		})
	}
}

// TestSyncObjectMootBehindACallInFlight holds SyncObject's doc to what it
// does when the pending call it makes moot waits behind a call in flight:
// it is not Skipped at once — the call in flight may still change what
// the pending one has to do — but once that call is done, unsent.
func TestSyncObjectMootBehindACallInFlight(t *testing.T) {
	text := liveDoc(t, "Dispatcher", "SyncObject")
	for _, s := range []string{
		"If the call then has nothing left to change, it ends Skipped for every waiter: at once if the pod has no call in flight; otherwise once that call is done",
	} {
		require.Contains(t, text, s, "SyncObject's doc")
	}
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		d := newTestDispatcher(t, api, Options{})
		release := api.hold("create/binding", "p")
		bind := submit(t, d, Bind(api.pod("p"), "n1"))
		synctest.Wait() // in flight, held at the server
		ready := v1.PodCondition{Type: "example.com/Ready", Status: v1.ConditionTrue}
		patch := submit(t, d, PatchStatus(api.pod("p"), StatusPatch{Conditions: []v1.PodCondition{ready}}))
		pod := api.change("p", func(p *v1.Pod) { p.Status.Conditions = []v1.PodCondition{ready} })
		_, err := d.SyncObject(pod)
		require.NoError(t, err)
		synctest.Wait()
		select {
		case <-patch.Done():
			t.Fatal("the pending patch ended while the binding was in flight")
		default:
		}
		release()
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, bind).State)
		assert.Equal(t, dispatch.StateSkipped, outcome(t, patch).State, "moot once the binding is done")
		assert.Zero(t, api.count("patch/status"), "never sent")
	})
}

// liveDoc returns the doc comment of typ's method name in this package's
// sources, with runs of white space as one space.
func liveDoc(t *testing.T, typ, name string) string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/coalescer/dispatch/kube")
	require.NoError(t, err)
	for _, ty := range p.Types {
		if ty.Name != typ {
			continue
		}
		for _, m := range ty.Methods {
			if m.Name == name {
				return strings.Join(strings.Fields(m.Doc), " ")
			}
		}
	}
	t.Fatalf("no method %s.%s", typ, name)
	return ""
}
