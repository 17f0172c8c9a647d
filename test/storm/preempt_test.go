package storm

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// The preempt shape (-storm.workload=preempt): a storm of preemptions.
//
// Every node is full of low-priority victims, VictimsPerNode of them (one
// more than the preemptors need, see preemptShape), each
// requesting an equal share of the node's CPU, bound from their creation
// (spec.nodeName set, as running pods are: no kubelet runs here). The
// storm's pods are the storm shape's. Once the storm's first condition
// lands, the schedulable pods arrive at the same rate, and they are
// preemptors: each requests one victim's share at a priority above the
// victims', so it fits no node as the nodes stand, and fits a node once one
// of its victims is gone.
//
// So each preemptor's first attempt fails (NodeResourcesFit), and
// DefaultPreemption's PostFilter picks a node and one victim on it. With
// SchedulerAsyncPreemption (on by default since 1.33) a goroutine then
// patches the victim's DisruptionTarget condition and deletes it, on the
// scheduler's clientset (its token bucket, never the dispatcher), while the
// failure handler sends the preemptor's nomination: a status patch setting
// PodScheduled=False and status.nominatedNodeName, through the dispatcher
// when SchedulerAsyncAPICalls is on. The victim's deletion brings the
// preemptor back to the queue; its next attempt binds it to the nominated
// node, through the dispatcher. Each preemptor costs the bucket four
// requests (the victim's patch and deletion, the nomination, the binding),
// each through a different path.
//
// The priorities: victims victimPriority, in a class of their own;
// preemptors HighPriority (the high class, preemptionPolicy
// PreemptLowerPriority) in both variants, since they must be above the
// victims; the storm's pods 0 in "high", below the preemptors as in the
// storm shape, and the preemptors' class in "same", where the scheduling
// queue orders the preemptors among the storm's pods by arrival only. The
// storm's pods, above the victims in "same", try preemption too, but their
// NodeAffinity failure is UnschedulableAndUnresolvable on every node, so
// DefaultPreemption finds no candidate and evicts nothing.

var workloadFlag = flag.String("storm.workload", "",
	`comma-separated workload shapes: "storm" (schedulable pods that fit at once) and "preempt" (preemptors that fit a node only once a low-priority victim on it is evicted); empty: the size's`)

// sizeShapes are the workload shapes each size runs unless -storm.workload
// says otherwise: CI's runs both, one after the other; the full size the
// storm, the preempt shape being a command of its own (see the README).
var sizeShapes = map[string]string{
	"full": "storm",
	"ci":   "storm," + shapePreempt,
}

const (
	// shapePreempt is Workload.Shape of the storm of preemptions.
	shapePreempt = "preempt"
	// victimPrefix names the victims, victimClass is their
	// PriorityClass, of value victimPriority.
	victimPrefix   = "victim-"
	victimClass    = "storm-victim"
	victimPriority = 100
	// preemptStall is how long a run of the preempt shape waits, once the
	// storm has drained, for a preemptor to be bound before it ends with
	// the rest stuck (Result.Stuck). Upstream's asynchronous preemption
	// can leave a preemptor in the unschedulable pool with nothing to
	// bring it back: when the last victim it deletes was already deleted
	// for another preemptor, no deletion event comes after its preemption
	// ends, and it waits for the next cluster event or the five-minute
	// flush. A run waits for neither.
	preemptStall = 30 * time.Second
)

// preemptShape returns w as the preempt shape: enough victims on each node
// that every preemptor has one to evict, and one more. The spare is
// needed: a preemptor whose victim's deletion has returned, retried (on
// another victim's deletion event) before the informer delivers its own
// victim's, still finds that victim in the scheduler's cache, and evicts
// another one. With exactly one victim per preemptor, runs here left a
// preemptor with none to evict, for good (9 of 10 bound after 3
// minutes); Result.VictimsDeleted beyond one per preemptor counts those
// second evictions.
func preemptShape(w Workload) Workload {
	w.Shape = shapePreempt
	w.VictimsPerNode = (w.Schedulable+w.Nodes-1)/max(1, w.Nodes) + 1
	return w
}

// victims is how many victims w creates: none in the storm shape.
func victims(w Workload) int {
	if w.Shape != shapePreempt {
		return 0
	}
	return w.Nodes * w.VictimsPerNode
}

// slotCPU is what a victim and a preemptor request of a node's CPU: an
// equal share of it, rounded down to the millicore, so that a node's
// victims fill it to within VictimsPerNode millicores, which no preemptor
// fits, and one victim gone leaves room for exactly one preemptor.
func slotCPU(w Workload) resource.Quantity {
	allocatable := node(0).Status.Allocatable[corev1.ResourceCPU]
	return *resource.NewMilliQuantity(allocatable.MilliValue()/int64(max(1, w.VictimsPerNode)), resource.DecimalSI)
}

// preemptClasses are the preempt shape's PriorityClasses: the preemptors'
// (the high class, stated to preempt lower priorities) and the victims'.
func preemptClasses(w Workload) []*schedulingv1.PriorityClass {
	preempt := corev1.PreemptLowerPriority
	return []*schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: highClass}, Value: w.HighPriority, PreemptionPolicy: &preempt},
		{ObjectMeta: metav1.ObjectMeta{Name: victimClass}, Value: victimPriority},
	}
}

// victimPod is the i-th victim, bound to node i / VictimsPerNode. Its
// grace period is 0: with no kubelet to confirm a graceful deletion, the
// apiserver would otherwise keep a deleted victim, terminating, for ever,
// and its preemptor would wait for it.
func victimPod(w Workload, i int) *corev1.Pod {
	p := slotPod(fmt.Sprintf("%s%05d", victimPrefix, i), w)
	p.Spec.PriorityClassName = victimClass
	p.Spec.NodeName = node(i / max(1, w.VictimsPerNode)).Name
	return p
}

// slotPod is a pause pod requesting one slot of a node's CPU.
func slotPod(name string, w Workload) *corev1.Pod {
	p := pod(name)
	c := &p.Spec.Containers[0]
	c.Resources.Requests[corev1.ResourceCPU] = slotCPU(w)
	c.Resources.Limits = c.Resources.Requests
	grace := int64(0)
	p.Spec.TerminationGracePeriodSeconds = &grace
	return p
}

// stormPodOf is the i-th pod of w's storm: in the preempt shape's "same"
// variant, at the preemptors' priority.
func stormPodOf(w Workload, i int, prio string) *corev1.Pod {
	p := stormPod(i)
	if w.Shape == shapePreempt && prio == "same" {
		p.Spec.PriorityClassName = highClass
	}
	return p
}

// schedulablePodOf is w's i-th schedulable pod: in the preempt shape, a
// preemptor.
func schedulablePodOf(w Workload, i int, prio string) *corev1.Pod {
	if w.Shape != shapePreempt {
		return schedulablePod(i, prio)
	}
	p := slotPod(fmt.Sprintf("%s%04d", podPrefix, i), w)
	p.Spec.PriorityClassName = highClass
	return p
}

// checkPreemption asserts that every preemptor bound took a victim's
// place: the nodes were full, so binding n preemptors takes at least n
// victims deleted.
func checkPreemption(t *testing.T, r *Result) {
	t.Helper()
	assert.GreaterOrEqual(t, r.VictimsDeleted, r.Bound, "victims deleted: at least one per preemptor bound, every node being full")
	assert.LessOrEqual(t, r.VictimsDeleted, r.Victims, "victims deleted, of those created")
}

// checkPreemptOrdering asserts the preempt shape's ordering against the
// storm, for dispatch: every preemptor bound was bound before the storm's
// last condition landed, its victim's deletion not waiting in the
// client's token bucket behind the storm's patches.
func checkPreemptOrdering(t *testing.T, r *Result) {
	t.Helper()
	if r.Scheduler == "dispatch" {
		assert.Equal(t, r.Bound, r.BoundBeforeDrain,
			"preemptors bound before the storm's last condition landed, of those bound")
	}
}

// checkPreemptAgainstUpstream asserts, for each priority variant run with
// both, that upstream's median preemptor was bound later than dispatch's:
// with upstream's dispatcher the deletions wait in the bucket behind the
// storm's patches (the check that the storm was in the way, without which
// checkPreemptOrdering would prove nothing). It compares the two runs, not
// upstream's with the storm's drain: a race-instrumented scheduler on a
// loaded machine fails the storm's pods slowly, and the drain then comes
// late (upstream had bound 23 of 30 preemptors by a drain at 14.4 s in a
// run here beside another package's tests; at CI's size its median was
// 8.3–10.9 s against dispatch's 1.6–4.5 s in three runs).
func checkPreemptAgainstUpstream(t *testing.T, results []*Result) {
	t.Helper()
	for _, prio := range []string{"high", "same"} {
		up, dp := upstreamAndDispatch(results, prio)
		if up == nil || dp == nil {
			continue
		}
		assert.Greater(t, up.BindP50, dp.BindP50,
			"%s: upstream's median preemptor bound later than dispatch's (its victims' deletions behind the storm)", prio)
	}
}

// preemptColumns are the preempt shape's figures, one run a row.
func preemptColumns(r *Result) []string {
	return []string{
		r.Priority, r.Scheduler, fmtMs(r.BindP50), fmtMs(r.BindP99), fmtMs(r.BindMax),
		fmt.Sprintf("%d/%d", r.Nominated, r.Workload.Schedulable), fmtMs(r.NominateP50), fmtMs(r.NominateP99),
		fmt.Sprintf("%d/%d", r.VictimsDeleted, r.Victims), fmt.Sprintf("%.1f s", r.LastVictimDeleted), fmtWait(r.DeleteWait),
		fmt.Sprintf("%.1f s", r.StormDrained), fmt.Sprint(r.ConditionsAtLastBound),
		fmt.Sprint(requests(r)), fmt.Sprint(r.Requests["delete pods"]), fmt.Sprint(r.StatusPatches), fmt.Sprint(r.Bindings),
		fmt.Sprintf("%d/%d", r.Conditions, r.Workload.Unschedulable), fmt.Sprint(r.Stuck), fmt.Sprint(r.Lost), fmt.Sprint(r.DoubleBound), fmt.Sprint(r.Status429),
	}
}

var preemptHeader = []string{
	"priority", "scheduler", "bind p50", "bind p99", "bind max", "nominated", "nominated p50", "nominated p99",
	"victims deleted", "last victim deleted", "deletion's wait p50/p99", "storm drained", "conditions at last bound",
	"requests", "deletes", "status patches", "bindings", "conditions", "stuck", "lost", "bound twice", "429s",
}

// fmtWait formats Result.DeleteWait.
func fmtWait(w []float64) string {
	if len(w) != 2 {
		return "-"
	}
	return fmtMs(w[0]) + " / " + fmtMs(w[1])
}

// preemptTable formats the preempt shape's figures as aligned text.
func preemptTable(results []*Result) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(preemptHeader, "\t")+"\t")
	for _, r := range results {
		fmt.Fprintln(tw, strings.Join(preemptColumns(r), "\t")+"\t")
	}
	tw.Flush()
	return b.String()
}

// preemptMarkdown formats the preempt shape's figures as a Markdown table.
func preemptMarkdown(results []*Result) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(preemptHeader, " | ") + " |\n")
	b.WriteString("|---|---|" + strings.Repeat("--:|", len(preemptHeader)-2) + "\n")
	for _, r := range results {
		b.WriteString("| " + strings.Join(preemptColumns(r), " | ") + " |\n")
	}
	return b.String()
}

// TestPreemptShape checks the preempt shape's construction without a
// server, at both sizes and in both priority variants: the priorities
// (victims below the preemptors, the storm's pods below them or equal),
// that every node's victims fit it and leave no room for a preemptor,
// that one victim gone leaves room for one, that there is a victim for
// every preemptor, and that the storm's pods fit no node. The storm shape
// keeps its one class and has no victims.
func TestPreemptShape(t *testing.T) {
	for _, size := range []string{"ci", "full"} {
		for _, prio := range []string{"high", "same"} {
			t.Run(size+"/"+prio, func(t *testing.T) {
				w := preemptShape(sizes[size])
				classes := map[string]*schedulingv1.PriorityClass{}
				for _, pc := range priorityClasses(w) {
					classes[pc.Name] = pc
				}
				priority := func(p *corev1.Pod) int32 {
					if p.Spec.PriorityClassName == "" {
						return 0 // no global default class
					}
					pc, ok := classes[p.Spec.PriorityClassName]
					require.True(t, ok, "%s: class %q not created", p.Name, p.Spec.PriorityClassName)
					return pc.Value
				}

				preemptor := schedulablePodOf(w, 0, prio)
				pc := classes[preemptor.Spec.PriorityClassName]
				require.NotNil(t, pc, "the preemptors have a class")
				require.NotNil(t, pc.PreemptionPolicy)
				assert.Equal(t, corev1.PreemptLowerPriority, *pc.PreemptionPolicy)
				storm := stormPodOf(w, 0, prio)
				if prio == "same" {
					assert.Equal(t, priority(preemptor), priority(storm), "same: the storm at the preemptors' priority")
				} else {
					assert.Less(t, priority(storm), priority(preemptor), "high: the storm below the preemptors")
				}

				n := victims(w)
				require.GreaterOrEqual(t, n, w.Schedulable+w.Nodes, "a victim for every preemptor, and one spare a node")
				nodes := make([]*corev1.Node, w.Nodes)
				onNode := map[string][]*corev1.Pod{}
				for i := range w.Nodes {
					nodes[i] = node(i)
				}
				for i := range n {
					v := victimPod(w, i)
					assert.Less(t, priority(v), priority(preemptor), "%s below the preemptors", v.Name)
					require.NotNil(t, v.Spec.TerminationGracePeriodSeconds)
					assert.Zero(t, *v.Spec.TerminationGracePeriodSeconds, "%s deleted at once, with no kubelet", v.Name)
					onNode[v.Spec.NodeName] = append(onNode[v.Spec.NodeName], v)
				}
				for _, nd := range nodes {
					vs := onNode[nd.Name]
					require.Len(t, vs, w.VictimsPerNode, "%s's victims", nd.Name)
					assert.True(t, fits(nd, vs), "%s holds its victims", nd.Name)
					assert.False(t, fits(nd, append(vs[:len(vs):len(vs)], preemptor)), "%s full: no preemptor fits beside its victims", nd.Name)
					assert.True(t, fits(nd, append(vs[1:len(vs):len(vs)], preemptor)), "%s: one victim gone, a preemptor fits", nd.Name)
					assert.False(t, matches(stormPodOf(w, 1, prio), nd), "the storm's pods select no label %s has", nd.Name)
				}
			})
		}
	}

	t.Run("storm", func(t *testing.T) {
		w := sizes["full"]
		assert.Zero(t, victims(w))
		classes := priorityClasses(w)
		require.Len(t, classes, 1)
		assert.Equal(t, highClass, classes[0].Name)
		assert.Equal(t, schedulablePod(3, "high"), schedulablePodOf(w, 3, "high"))
		assert.Equal(t, stormPod(3), stormPodOf(w, 3, "same"))
	})
}

// fits says whether pods' requests (CPU, memory, pod count) fit nd's
// allocatable, as NodeResourcesFit counts them.
func fits(nd *corev1.Node, pods []*corev1.Pod) bool {
	used := corev1.ResourceList{}
	for _, p := range pods {
		for name, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if u, a := used[name], nd.Status.Allocatable[name]; u.Cmp(a) > 0 {
			return false
		}
	}
	return int64(len(pods)) <= nd.Status.Allocatable.Pods().Value()
}

// matches says whether p's node selector and required affinity admit nd.
func matches(p *corev1.Pod, nd *corev1.Node) bool {
	ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(nd)
	return err == nil && ok
}

// TestDeleteWait pairs each victim's deletion with the status patch
// answered before it, and leaves out a deletion with no patch of its own
// before it (a second preemptor's, of a victim already marked).
func TestDeleteWait(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	patch := func(name string, answered int) apiserver.Request {
		return apiserver.Request{Verb: "patch", Resource: "pods", Subresource: "status", Name: name, Status: 200,
			Received: at(answered - 5), Answered: at(answered)}
	}
	del := func(name string, received int) apiserver.Request {
		return apiserver.Request{Verb: "delete", Resource: "pods", Name: name, Status: 200, Received: at(received), Answered: at(received + 5)}
	}
	reqs := []apiserver.Request{
		del(victimPrefix+"1", 1300), // out of order: sorted by receipt
		patch(victimPrefix+"1", 100),
		patch(victimPrefix+"2", 200),
		del(victimPrefix+"2", 220),
		del(victimPrefix+"2", 400), // no patch of its own
		patch("storm-00001", 10),
		del("pod-0001", 20),
	}
	assert.Equal(t, []float64{20, 1200}, deleteWait(reqs))
	assert.Nil(t, deleteWait(reqs[5:]))
}

// TestStalled ends a run of the preempt shape only once the storm has
// drained and no preemptor has been bound for the quiet period since, the
// later of the two counting.
func TestStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		rec := newRecorder(Workload{Unschedulable: 1, Schedulable: 2})
		stalled := rec.stalled(ctx, 30*time.Second)
		after := func(d time.Duration) bool {
			time.Sleep(d)
			synctest.Wait()
			select {
			case <-stalled:
				return true
			default:
				return false
			}
		}

		require.False(t, after(40*time.Second), "no preemptor bound for 40 s, but the storm not drained")
		failed := stormPod(0)
		failed.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		rec.observe(failed)
		require.False(t, after(20*time.Second), "20 s after the drain")
		bound := schedulablePod(0, "high")
		bound.Spec.NodeName = "node-000"
		rec.observe(bound)
		require.False(t, after(20*time.Second), "20 s after a binding")
		require.True(t, after(11*time.Second), "31 s after the last binding, the storm drained")
	})
}
