package storm

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/coalescer/dispatch/test/integration/apiserver"
	"github.com/coalescer/dispatch/test/storm/internal/schedout"
)

// Result is one run's measurements. Times come from the server's side:
// the test's informer (when the watch delivered each change) and the
// proxy in front of the apiserver (when each of the scheduler's requests
// was answered). Times of day are seconds or milliseconds since the
// scheduler was started, with the storm's pods already created.
type Result struct {
	Priority   string   `json:"priority"`  // high or same
	Scheduler  string   `json:"scheduler"` // sync, upstream, limiter or dispatch
	Workload   Workload `json:"workload"`
	Dispatcher string   `json:"dispatcher"` // what the binary linked
	Kubernetes string   `json:"kubernetes"` // where its k8s.io/kubernetes came from

	// Each schedulable pod's creation → spec.nodeName set, in ms.
	BindP50 float64 `json:"bind_p50_ms"`
	BindP99 float64 `json:"bind_p99_ms"`
	BindMax float64 `json:"bind_max_ms"`
	// Throughput is schedulable pods bound per second, from the first
	// one's creation to the last one's binding.
	Throughput float64 `json:"throughput_pods_per_s"`
	// LastBound is when the last schedulable pod was bound, and
	// StormDrained when the last PodScheduled=False condition landed, in
	// seconds.
	LastBound    float64 `json:"last_bound_s"`
	StormDrained float64 `json:"storm_drained_s"`
	// BoundBeforeDrain counts the schedulable pods bound before the last
	// condition landed; ConditionsAtLastBound counts the storm's
	// conditions that had landed when the last schedulable pod was bound.
	BoundBeforeDrain      int `json:"bound_before_drain"`
	ConditionsAtLastBound int `json:"conditions_at_last_bound"`
	// ConditionsBefore is, for the median schedulable pod, how many of
	// the storm's conditions had landed before it was bound; Overtaking
	// is, at the median and at most, how many landed between a pod's
	// creation and its binding: the patches that went first.
	ConditionsBefore int `json:"conditions_before_median_bind"`
	OvertakingMedian int `json:"overtaking_median"`
	OvertakingMax    int `json:"overtaking_max"`

	// Bound is the schedulable pods read back with spec.nodeName, and
	// Conditions the unschedulable pods read back with PodScheduled=False;
	// Lost is what either misses. StormBound counts unschedulable pods
	// with a node (none can fit). DoubleBound counts pods with more than
	// one binding the server accepted, or whose node the informer saw
	// change.
	Bound       int `json:"bound"`
	Conditions  int `json:"conditions"`
	Lost        int `json:"lost"`
	StormBound  int `json:"storm_bound"`
	DoubleBound int `json:"double_bound"`
	// Bindings counts the binding requests the server accepted (201),
	// BindingsRefused the others; StatusPatches the status patches.
	Bindings        int `json:"bindings"`
	BindingsRefused int `json:"bindings_refused"`
	StatusPatches   int `json:"status_patches"`
	// Requests counts every request of the scheduler's the server saw,
	// by verb and resource ("patch pods/status"); Status429 those it
	// answered 429 Too Many Requests.
	Requests  map[string]int `json:"requests"`
	Status429 int            `json:"status_429"`
	// Failures counts the requests not answered 2xx, by request and
	// answer ("create pods/binding 409"; "error" when the proxy got no
	// answer).
	Failures map[string]int `json:"failures,omitempty"`
	// ServerBinding and ServerPatch are the time bindings and status
	// patches spent at the server (the proxy's receipt → the answer),
	// p50 and p99 in ms; InFlightMax is the most of those two kinds the
	// server held from the scheduler at once.
	ServerBinding [2]float64 `json:"server_binding_p50_p99_ms"`
	ServerPatch   [2]float64 `json:"server_patch_p50_p99_ms"`
	InFlightMax   int        `json:"in_flight_max"`
	// Counters are the scheduler's own (see package schedout).
	Counters map[string]float64 `json:"counters"`

	// The preempt shape's. Nominated counts the preemptors the informer
	// saw with status.nominatedNodeName (the nomination's status patch
	// landed; a dispatcher may drop a nomination still queued when the
	// pod's binding comes), and NominateP50 and NominateP99 are their
	// creation → nomination seen, in ms. Victims counts the victims
	// created and VictimsDeleted those gone when read back;
	// LastVictimDeleted is when the informer saw the last one go, in
	// seconds.
	//
	// Stuck counts the preemptors the scheduler never scheduled when the
	// run ended (see preemptStall): left in its unschedulable pool, which
	// only a cluster event or its five-minute flush would retry. Lost
	// leaves them out.
	Stuck             int     `json:"stuck,omitempty"`
	Nominated         int     `json:"nominated,omitempty"`
	NominateP50       float64 `json:"nominate_p50_ms,omitempty"`
	NominateP99       float64 `json:"nominate_p99_ms,omitempty"`
	Victims           int     `json:"victims,omitempty"`
	VictimsDeleted    int     `json:"victims_deleted,omitempty"`
	LastVictimDeleted float64 `json:"last_victim_deleted_s,omitempty"`
	// DeleteWait is the p50 and p99, in ms, of the time from the
	// server's answer to a victim's DisruptionTarget patch to the arrival
	// of the deletion that follows it: preemption sends the two one after
	// the other on the scheduler's clientset, beside the dispatcher, so
	// that is the deletion's wait in the client's token bucket.
	DeleteWait []float64 `json:"victim_delete_wait_p50_p99_ms,omitempty"`

	// Pods are the schedulable pods' creation and binding, in ms.
	Pods []PodTiming `json:"pods"`
	// Rates are the scheduler's requests per second at the server, by
	// kind, in buckets of Bucket seconds from the scheduler's start.
	Bucket float64      `json:"bucket_s"`
	Rates  []RateSample `json:"rates"`
}

// PodTiming is one schedulable pod's creation and binding, as the
// informer saw them, in ms since the scheduler was started, and when the
// proxy received the scheduler's binding request the server accepted, and
// had the server's answer: creation → request is the scheduler's part
// (its informer, queue, cycles and dispatcher), request → answer the
// server's, answer → bound the watch's back to the test.
type PodTiming struct {
	Name            string  `json:"name"`
	Created         float64 `json:"created_ms"`
	Bound           float64 `json:"bound_ms"`
	BindingReceived float64 `json:"binding_received_ms,omitempty"`
	BindingAnswered float64 `json:"binding_answered_ms,omitempty"`
	// Nominated is when a preemptor was first seen with its nominated
	// node, if it was.
	Nominated float64 `json:"nominated_ms,omitempty"`
}

// RateSample is the scheduler's requests per second the server answered
// in one bucket, by kind.
type RateSample struct {
	At            float64 `json:"at_s"` // the bucket's start
	StatusPatches float64 `json:"status_patches"`
	Bindings      float64 `json:"bindings"`
	Events        float64 `json:"events"`
	Other         float64 `json:"other"`
	// Rejected counts the requests of any kind answered 429.
	Rejected float64 `json:"rejected"`
}

// resultMeta is what a run knows besides the measurements.
type resultMeta struct {
	priority, scheduler    string
	workload               Workload
	dispatcher, kubernetes string
	counters               map[string]float64
}

// rateBucket is the width of a RateSample.
const rateBucket = 500 * time.Millisecond

// measure turns what the informer recorded, the pods read back at the end
// and the proxy's log of the scheduler's requests into a Result.
func measure(rec *recorder, pods []corev1.Pod, reqs []apiserver.Request, m resultMeta) *Result {
	w := m.workload
	r := &Result{
		Priority: m.priority, Scheduler: m.scheduler, Workload: w,
		Dispatcher: m.dispatcher, Kubernetes: m.kubernetes, Counters: m.counters,
		Requests: map[string]int{},
		Failures: map[string]int{},
		Bucket:   rateBucket.Seconds(),
	}
	seen := rec.snapshot()

	// What the server holds at the end.
	r.Victims = victims(w)
	r.VictimsDeleted = r.Victims
	for i := range pods {
		p := &pods[i]
		if strings.HasPrefix(p.Name, victimPrefix) {
			r.VictimsDeleted--
			continue
		}
		if strings.HasPrefix(p.Name, podPrefix) {
			if p.Spec.NodeName != "" {
				r.Bound++
			}
			continue
		}
		if unschedulable(p) {
			r.Conditions++
		}
		if p.Spec.NodeName != "" {
			r.StormBound++
		}
	}
	if w.Shape == shapePreempt {
		// A binding the scheduler counted that the server does not hold
		// is lost; a preemptor it never scheduled is stuck.
		scheduled := r.Bound
		if v, ok := m.counters[schedout.ScheduledKey]; ok {
			scheduled = max(r.Bound, int(v))
		}
		r.Stuck = w.Schedulable - scheduled
	}
	r.Lost = (w.Schedulable - r.Bound - r.Stuck) + (w.Unschedulable - r.Conditions)

	// The order the informer saw: the storm's conditions, then each
	// schedulable pod against them.
	t0 := rec.startTime()
	var conditionSeqs []int
	var drained time.Duration
	for _, p := range seen {
		if !p.schedulable && p.failedSeq > 0 {
			conditionSeqs = append(conditionSeqs, p.failedSeq)
			drained = max(drained, p.failed.Sub(t0))
		}
	}
	slices.Sort(conditionSeqs)
	lastCondition := 0
	if len(conditionSeqs) > 0 {
		lastCondition = conditionSeqs[len(conditionSeqs)-1]
	}
	r.StormDrained = drained.Seconds()
	var latencies, nominations []time.Duration
	var before, overtaking []int
	firstCreated, lastBound := time.Duration(math.MaxInt64), time.Duration(0)
	lastBoundSeq := 0
	doubles := map[string]bool{}
	accepted := map[string]apiserver.Request{} // each pod's accepted binding
	for _, q := range reqs {
		if requestKind(q) == "binding" && q.Status == 201 {
			accepted[q.Name] = q
		}
	}
	for name, p := range seen {
		if p.rebound > 0 {
			doubles[name] = true
		}
		if p.victim && !p.deleted.IsZero() {
			r.LastVictimDeleted = max(r.LastVictimDeleted, p.deleted.Sub(t0).Seconds())
		}
		if !p.schedulable || p.boundSeq == 0 {
			continue
		}
		created, bound := p.created.Sub(t0), p.bound.Sub(t0)
		latencies = append(latencies, bound-created)
		firstCreated, lastBound = min(firstCreated, created), max(lastBound, bound)
		lastBoundSeq = max(lastBoundSeq, p.boundSeq)
		pt := PodTiming{Name: name, Created: ms(created), Bound: ms(bound)}
		if p.nominatedSeq > 0 {
			nominations = append(nominations, p.nominated.Sub(p.created))
			pt.Nominated = ms(p.nominated.Sub(t0))
		}
		if q, ok := accepted[name]; ok {
			pt.BindingReceived, pt.BindingAnswered = ms(q.Received.Sub(t0)), ms(q.Answered.Sub(t0))
		}
		r.Pods = append(r.Pods, pt)
		if p.boundSeq < lastCondition {
			r.BoundBeforeDrain++
		}
		b := sort.SearchInts(conditionSeqs, p.boundSeq)
		before = append(before, b)
		overtaking = append(overtaking, b-sort.SearchInts(conditionSeqs, p.createdSeq))
	}
	slices.SortFunc(r.Pods, func(a, b PodTiming) int { return strings.Compare(a.Name, b.Name) })
	if len(latencies) > 0 {
		slices.Sort(latencies)
		r.BindP50 = ms(percentile(latencies, 0.50))
		r.BindP99 = ms(percentile(latencies, 0.99))
		r.BindMax = ms(latencies[len(latencies)-1])
		r.LastBound = lastBound.Seconds()
		if span := lastBound - firstCreated; span > 0 {
			r.Throughput = float64(len(latencies)) / span.Seconds()
		}
		slices.Sort(before)
		slices.Sort(overtaking)
		r.ConditionsBefore = percentile(before, 0.5)
		r.ConditionsAtLastBound = sort.SearchInts(conditionSeqs, lastBoundSeq)
		r.OvertakingMedian = percentile(overtaking, 0.5)
		r.OvertakingMax = overtaking[len(overtaking)-1]
	}
	if len(nominations) > 0 {
		slices.Sort(nominations)
		r.Nominated = len(nominations)
		r.NominateP50 = ms(percentile(nominations, 0.50))
		r.NominateP99 = ms(percentile(nominations, 0.99))
	}

	r.DeleteWait = deleteWait(reqs)

	// What the scheduler asked of the server.
	bindings := map[string]int{}
	atServer := map[string][]time.Duration{}
	type edge struct {
		at   time.Time
		step int
	}
	var edges []edge
	for _, q := range reqs {
		if k := requestKind(q); (k == "binding" || k == "status patch") && !q.Answered.IsZero() {
			atServer[k] = append(atServer[k], q.Answered.Sub(q.Received))
			edges = append(edges, edge{q.Received, 1}, edge{q.Answered, -1})
		}
		key := q.Verb + " " + q.Resource
		if q.Subresource != "" {
			key += "/" + q.Subresource
		}
		r.Requests[key]++
		switch {
		case q.Status == 0:
			r.Failures[key+" error"]++
		case q.Status < 200 || q.Status > 299:
			r.Failures[fmt.Sprintf("%s %d", key, q.Status)]++
		}
		if q.Status == 429 {
			r.Status429++
		}
		kind := requestKind(q)
		switch kind {
		case "binding":
			if q.Status == 201 {
				bindings[q.Name]++
				r.Bindings++
			} else {
				r.BindingsRefused++
			}
		case "status patch":
			r.StatusPatches++
		}
		at := q.Answered.Sub(t0)
		if at < 0 {
			continue // the scheduler's start: informers listing
		}
		i := int(at / rateBucket)
		for len(r.Rates) <= i {
			r.Rates = append(r.Rates, RateSample{At: float64(len(r.Rates)) * r.Bucket})
		}
		s := &r.Rates[i]
		per := 1 / r.Bucket
		switch kind {
		case "binding":
			s.Bindings += per
		case "status patch":
			s.StatusPatches += per
		case "event":
			s.Events += per
		default:
			s.Other += per
		}
		if q.Status == 429 {
			s.Rejected += per
		}
	}
	for kind, into := range map[string]*[2]float64{"binding": &r.ServerBinding, "status patch": &r.ServerPatch} {
		if d := atServer[kind]; len(d) > 0 {
			slices.Sort(d)
			*into = [2]float64{ms(percentile(d, 0.5)), ms(percentile(d, 0.99))}
		}
	}
	// Answers before receipts at the same instant: a request that ends
	// as another starts was not in flight with it.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.step - b.step
	})
	inFlight := 0
	for _, e := range edges {
		inFlight += e.step
		r.InFlightMax = max(r.InFlightMax, inFlight)
	}
	for name, n := range bindings {
		if n > 1 {
			doubles[name] = true
		}
	}
	r.DoubleBound = len(doubles)
	return r
}

// deleteWait returns the p50 and p99 of the time between the answer to a
// victim's status patch and the victim's next deletion's receipt, in ms,
// or nil if no victim was deleted that way.
func deleteWait(reqs []apiserver.Request) []float64 {
	reqs = slices.Clone(reqs)
	slices.SortFunc(reqs, func(a, b apiserver.Request) int { return a.Received.Compare(b.Received) })
	patched := map[string]time.Time{} // a victim's last patch answered, not yet followed by a deletion
	var waits []time.Duration
	for _, q := range reqs {
		if !strings.HasPrefix(q.Name, victimPrefix) {
			continue
		}
		switch {
		case requestKind(q) == "status patch" && q.Status == 200:
			patched[q.Name] = q.Answered
		case q.Verb == "delete" && q.Resource == "pods" && q.Subresource == "":
			if at, ok := patched[q.Name]; ok && !q.Received.Before(at) {
				waits = append(waits, q.Received.Sub(at))
			}
			delete(patched, q.Name)
		}
	}
	if len(waits) == 0 {
		return nil
	}
	slices.Sort(waits)
	return []float64{ms(percentile(waits, 0.5)), ms(percentile(waits, 0.99))}
}

// requestKind sorts a request of the scheduler's for the pictures.
func requestKind(q apiserver.Request) string {
	switch {
	case q.Resource == "pods" && q.Subresource == "binding" && q.Verb == "create":
		return "binding"
	case q.Resource == "pods" && q.Subresource == "status" && q.Verb == "patch":
		return "status patch"
	case q.Resource == "events":
		return "event"
	}
	return "other"
}

// percentile returns the nearest-rank q-quantile of the sorted s.
func percentile[T any](s []T, q float64) T {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// checkRun asserts the invariants every scheduler must keep: every
// schedulable pod bound, exactly once, and none of the storm's; every
// unschedulable pod's PodScheduled=False condition on the server.
func checkRun(t *testing.T, r *Result) {
	t.Helper()
	w := r.Workload
	want := w.Schedulable - r.Stuck // the preempt shape's stuck preemptors: see Result.Stuck
	assert.Equal(t, want, r.Bound, "schedulable pods bound (read back)")
	assert.Equal(t, w.Unschedulable, r.Conditions, "unschedulable pods with PodScheduled=False (read back)")
	assert.Zero(t, r.Lost, "lost: schedulable pods not bound plus unschedulable pods without their condition")
	assert.Zero(t, r.StormBound, "unschedulable pods bound")
	assert.Zero(t, r.DoubleBound, "pods bound twice")
	assert.Equal(t, want, r.Bindings, "bindings the server accepted: one per schedulable pod")
	assert.Len(t, r.Pods, want, "schedulable pods the informer saw bound")
	for _, p := range r.Pods {
		assert.True(t, p.BindingReceived > 0 && p.BindingAnswered >= p.BindingReceived, "%s: its accepted binding at the proxy, received then answered (%v, %v ms)", p.Name, p.BindingReceived, p.BindingAnswered)
	}
	assert.GreaterOrEqual(t, r.StatusPatches, w.Unschedulable, "status patches: at least one per unschedulable pod")
}

// checkOrdering asserts the order of the bindings against the storm, from
// the order the informer saw the server commit them: with dispatch inside,
// every schedulable pod is bound before the last of the storm's conditions
// lands; with upstream's dispatcher and the storm's priority, the median
// schedulable pod is bound only after more than a third of the storm's
// conditions landed, which is the bug (and shows the storm was queued
// when the pods arrived). The high-priority pods' share of the bug is
// checked against dispatch's run (checkOvertaking).
func checkOrdering(t *testing.T, r *Result) {
	t.Helper()
	switch {
	case r.Scheduler == "dispatch":
		assert.Equal(t, r.Workload.Schedulable, r.BoundBeforeDrain,
			"schedulable pods bound before the patch backlog drained (the storm's last condition)")
	case r.Scheduler == "upstream" && r.Priority == "same":
		assert.Greater(t, r.ConditionsBefore, r.Workload.Unschedulable/3,
			"kubernetes#135900 reproduced: the median schedulable pod bound only behind a large part of the storm's conditions")
	}
}

// checkOvertaking asserts, for the high-priority runs, that upstream's
// bindings waited behind more of the storm than dispatch's: its median
// schedulable pod was overtaken by more status patches between its
// creation and its binding. With upstream's dispatcher a high-priority
// pod is scheduled at once, and its binding waits behind every patch
// queued before it; how many are queued then depends on how fast the
// scheduler fails the storm's pods, which a race-instrumented scheduler
// on a loaded machine does slowly (at CI's size, its median pod was bound
// behind 166 to 473 of the 600 conditions in runs here; in the run of 166,
// overtaken by 22 patches, against dispatch's 4). So the comparison is
// with dispatch's run, not with a fixed share of the storm. At the full
// size, on a quiet machine: 1 536 to 1 558 against 1 to 5.
func checkOvertaking(t *testing.T, results []*Result) {
	t.Helper()
	up, dp := upstreamAndDispatch(results, "high")
	if up == nil || dp == nil {
		return
	}
	assert.Greater(t, up.OvertakingMedian, dp.OvertakingMedian,
		"high priority: upstream's median binding overtaken by more status patches than dispatch's (kubernetes#135900 at high priority)")
}

// upstreamAndDispatch returns the runs of upstream's dispatcher and of
// dispatch at priority variant prio, nil for one that did not run.
func upstreamAndDispatch(results []*Result, prio string) (up, dp *Result) {
	for _, r := range results {
		if r.Priority != prio {
			continue
		}
		switch r.Scheduler {
		case "upstream":
			up = r
		case "dispatch":
			dp = r
		}
	}
	return up, dp
}

// table formats the results as aligned text, one run a line.
func table(results []*Result) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "priority\tscheduler\tbind p50\tp99\tmax\tpods/s\tlast bound\tstorm drained\tbound before drain\tconditions at last bound\tpatches first (median/max)\trequests\tstatus patches\tbindings\t429s\tconditions\tlost\tbound twice\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f\t%.1fs\t%.1fs\t%d/%d\t%d\t%d/%d\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%d\t\n",
			r.Priority, r.Scheduler, fmtMs(r.BindP50), fmtMs(r.BindP99), fmtMs(r.BindMax), r.Throughput,
			r.LastBound, r.StormDrained, r.BoundBeforeDrain, r.Workload.Schedulable, r.ConditionsAtLastBound,
			r.OvertakingMedian, r.OvertakingMax, requests(r), r.StatusPatches, r.Bindings, r.Status429,
			r.Conditions, r.Workload.Unschedulable, r.Lost, r.DoubleBound)
	}
	tw.Flush()
	return b.String()
}

// requests is every request of the scheduler's the server saw.
func requests(r *Result) int {
	n := 0
	for _, c := range r.Requests {
		n += c
	}
	return n
}

// fmtMs formats milliseconds for the table: ms below 10 s, else seconds.
func fmtMs(v float64) string {
	if v < 10000 {
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fs", v/1000)
}

// describe says what w is, in a sentence without its full stop.
func describe(w Workload) string {
	if w.Shape == shapePreempt {
		return fmt.Sprintf("%d nodes, each full of %d low-priority victims; %d unschedulable pods at once, then %d preemptors one every %v",
			w.Nodes, w.VictimsPerNode, w.Unschedulable, w.Schedulable, w.Every)
	}
	return fmt.Sprintf("%d nodes; %d unschedulable pods at once, then %d schedulable pods one every %v",
		w.Nodes, w.Unschedulable, w.Schedulable, w.Every)
}

// writeResults writes results.json, results.md and storm-PRIORITY.svg
// into dir.
func writeResults(dir string, results []*Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(markdown(results)), 0o644); err != nil {
		return err
	}
	byPriority := map[string][]*Result{}
	for _, r := range results {
		byPriority[r.Priority] = append(byPriority[r.Priority], r)
	}
	prefix := "storm-"
	if results[0].Workload.Shape == shapePreempt {
		prefix = "preempt-"
	}
	for _, prio := range slices.Sorted(maps.Keys(byPriority)) {
		f, err := os.Create(filepath.Join(dir, prefix+prio+".svg"))
		if err != nil {
			return err
		}
		err = writeSVG(f, byPriority[prio])
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// markdown formats the results as the tables of the README.
func markdown(results []*Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s.\n\n", describe(results[0].Workload))
	b.WriteString("| priority | scheduler | bind p50 | bind p99 | bind max | pods/s | last bound | storm drained | bound before drain | conditions at last bound | patches first (median/max) | requests | conditions | lost | bound twice | 429s |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f | %.1f s | %.1f s | %d/%d | %d | %d/%d | %d | %d/%d | %d | %d | %d |\n",
			r.Priority, r.Scheduler, fmtMs(r.BindP50), fmtMs(r.BindP99), fmtMs(r.BindMax), r.Throughput,
			r.LastBound, r.StormDrained, r.BoundBeforeDrain, r.Workload.Schedulable, r.ConditionsAtLastBound,
			r.OvertakingMedian, r.OvertakingMax, requests(r), r.Conditions, r.Workload.Unschedulable, r.Lost, r.DoubleBound, r.Status429)
	}
	if results[0].Workload.Shape == shapePreempt {
		b.WriteString("\nThe preemptions (bind is a preemptor's creation → bound; nominated, its creation → first seen with " +
			"status.nominatedNodeName, over the preemptors seen nominated):\n\n")
		b.WriteString(preemptMarkdown(results))
	}
	b.WriteString("\nWhere the time went. From the scheduler's own histograms, means in ms: a scheduling attempt that bound " +
		"(its cycle and its binding cycle); the Bind extension point (with the gate on, a binding's Add → its outcome: " +
		"the wait in the dispatcher and the request); a binding's and a status patch's execution (upstream's includes the wait " +
		"for the client's token; the drop-in's takes it before); a pod's queue entry → bound " +
		"(scheduler_pod_scheduling_sli_duration_seconds). From the proxy, in ms: the time bindings and status patches spent " +
		"at the server, and the most of them the server held at once:\n\n")
	b.WriteString("| priority | scheduler | attempt that bound | Bind | binding executed | status patch executed | queue entry → bound |" +
		" binding at the server p50/p99 | status patch at the server p50/p99 | most in flight |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %.0f / %.0f | %.0f / %.0f | %d |\n", r.Priority, r.Scheduler,
			meanMs(r.Counters, "scheduler_scheduling_attempt_duration_seconds", "result=scheduled"),
			meanMs(r.Counters, "scheduler_framework_extension_point_duration_seconds", "extension_point=Bind"),
			meanMs(r.Counters, "scheduler_async_api_call_execution_duration_seconds", "call_type=pod_binding"),
			meanMs(r.Counters, "scheduler_async_api_call_execution_duration_seconds", "call_type=pod_status_patch"),
			meanMs(r.Counters, "scheduler_pod_scheduling_sli_duration_seconds", ""),
			r.ServerBinding[0], r.ServerBinding[1], r.ServerPatch[0], r.ServerPatch[1], r.InFlightMax)
	}
	// Requests by verb, one column per run.
	keys := map[string]bool{}
	for _, r := range results {
		for k := range r.Requests {
			keys[k] = true
		}
	}
	b.WriteString("\nRequests the server saw from the scheduler, by verb and resource:\n\n| request |")
	for _, r := range results {
		fmt.Fprintf(&b, " %s/%s |", r.Priority, r.Scheduler)
	}
	b.WriteString("\n|---|" + strings.Repeat("--:|", len(results)) + "\n")
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		fmt.Fprintf(&b, "| %s |", k)
		for _, r := range results {
			fmt.Fprintf(&b, " %d |", r.Requests[k])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// meanMs is the mean in ms of a histogram the scheduler reported (its
// _sum and _count counters), over the series whose labels contain label;
// "-" when it observed nothing.
func meanMs(counters map[string]float64, name, label string) string {
	var sum, count float64
	for k, v := range counters {
		series, labels, ok := strings.Cut(k, "{")
		if !ok || !strings.Contains(labels, label) {
			continue
		}
		switch series {
		case name + "_sum":
			sum += v
		case name + "_count":
			count += v
		}
	}
	if count == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", sum/count*1000)
}
