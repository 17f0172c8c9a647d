package storm

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/coalescer/dispatch/test/integration/apiserver"
	"github.com/coalescer/dispatch/test/storm/internal/variant"
)

// The workload's size and what to run: flags after the package on the go
// test command line, such as
//
//	go test -run TestStorm -v -timeout 60m . -storm.size=full -storm.out=results
var (
	sizeFlag = flag.String("storm.size", "ci",
		`workload size: "ci" (reduced: what CI runs) or "full" (the full storm: 100 nodes, 2000 unschedulable pods, 200 schedulable)`)
	nodesFlag         = flag.Int("storm.nodes", 0, "nodes to create (0: the size's)")
	unschedulableFlag = flag.Int("storm.unschedulable", 0, "pods no node fits, all created before the scheduler starts: the storm (0: the size's)")
	schedulableFlag   = flag.Int("storm.schedulable", 0, "schedulable pods, one every -storm.every once the storm is under way (0: the size's)")
	everyFlag         = flag.Duration("storm.every", 0, "interval between schedulable pods (0: the size's)")
	variantsFlag      = flag.String("storm.variants", "",
		"comma-separated schedulers to run: sync (SchedulerAsyncAPICalls off), upstream (upstream's APIDispatcher), dispatch (the drop-in); empty: the size's")
	prioritiesFlag = flag.String("storm.priorities", "high,same",
		"comma-separated priority variants: high (the schedulable pods above the storm's) and same")
	outFlag       = flag.String("storm.out", "", "write results.json, results.md and one SVG picture per priority variant into this `directory`")
	verbosityFlag = flag.Int("storm.v", 0, "klog verbosity of the scheduler processes, whose log is shown only when a run fails")
)

// Workload is one storm's shape.
type Workload struct {
	// Nodes is how many nodes exist; each fits every schedulable pod.
	Nodes int `json:"nodes"`
	// Unschedulable pods select a node label no node has. They all
	// exist when the scheduler starts, which lists them at once: a burst
	// in its queue. Each one's scheduling failure patches its status: the
	// storm.
	Unschedulable int `json:"unschedulable"`
	// Schedulable pods arrive one every Every from the moment the
	// storm's first condition lands.
	Schedulable int           `json:"schedulable"`
	Every       time.Duration `json:"every_ns"`
	// HighPriority is the schedulable pods' priority in the "high"
	// variant (through a PriorityClass); every other pod has priority 0.
	// The preempt shape gives it to its preemptors in both variants
	// (see preempt_test.go).
	HighPriority int32 `json:"high_priority"`
	// Shape is "" for the storm above, or "preempt": the schedulable
	// pods are preemptors, each fitting a node only once a low-priority
	// victim is evicted (see preempt_test.go).
	Shape string `json:"shape,omitempty"`
	// VictimsPerNode is, in the preempt shape, how many victims fill
	// each node: enough that every preemptor has one to evict.
	VictimsPerNode int `json:"victims_per_node,omitempty"`
}

// sizes are the workloads -storm.size names.
var sizes = map[string]Workload{
	// The full storm: the storm alone takes 40 s at kube-scheduler's 50
	// requests per second.
	"full": {Nodes: 100, Unschedulable: 2000, Schedulable: 200, Every: 50 * time.Millisecond, HighPriority: 1000},
	// CI's: a storm of about 10 s at 50 requests a second once the
	// client's burst of 100 is spent. The race-instrumented scheduler takes
	// seconds to attempt 600 pods on two cores, so the backlog the bug
	// needs builds while the schedulable pods arrive, over 4.5 s; at 300
	// pods and one every 50 ms, a third of the storm in the burst, it did
	// not always.
	"ci": {Nodes: 10, Unschedulable: 600, Schedulable: 30, Every: 150 * time.Millisecond, HighPriority: 1000},
}

// sizeVariants are the schedulers each size runs unless -storm.variants
// says otherwise. CI's leaves out the synchronous baseline: upstream's
// path with the gate off, which checks nothing of ours, and whose
// same-priority run is the longest (it binds only after the whole storm,
// one patch at a time). The full size runs all four: the baseline is in
// the figures, and so is the model of kubernetes#142123 (limiter),
// upstream's proposed fix.
var sizeVariants = map[string]string{
	"full": "sync,upstream,limiter,dispatch",
	"ci":   "upstream,dispatch",
}

// selectedVariants returns the schedulers the flags select, in the order
// they run.
func selectedVariants() ([]schedVariant, error) {
	names := *variantsFlag
	if names == "" {
		names = sizeVariants[*sizeFlag]
	}
	var variants []schedVariant
	for name := range strings.SplitSeq(names, ",") {
		i := slices.IndexFunc(schedVariants, func(v schedVariant) bool { return v.name == name })
		if i < 0 {
			return nil, fmt.Errorf("-storm.variants: unknown scheduler %q", name)
		}
		variants = append(variants, schedVariants[i])
	}
	return variants, nil
}

// workloads returns the workloads the flags describe, one per shape.
func workloads(t *testing.T) []Workload {
	t.Helper()
	shapes := *workloadFlag
	if shapes == "" {
		shapes = sizeShapes[*sizeFlag]
	}
	var ws []Workload
	for shape := range strings.SplitSeq(shapes, ",") {
		ws = append(ws, workload(t, shape))
	}
	return ws
}

// workload returns the workload of the given shape the flags describe.
func workload(t *testing.T, shape string) Workload {
	t.Helper()
	w, ok := sizes[*sizeFlag]
	if !ok {
		t.Fatalf("-storm.size=%q: want ci or full", *sizeFlag)
	}
	if *nodesFlag > 0 {
		w.Nodes = *nodesFlag
	}
	if *unschedulableFlag > 0 {
		w.Unschedulable = *unschedulableFlag
	}
	if *schedulableFlag > 0 {
		w.Schedulable = *schedulableFlag
	}
	if *everyFlag > 0 {
		w.Every = *everyFlag
	}
	switch shape {
	case "storm":
	case shapePreempt:
		w = preemptShape(w)
	default:
		t.Fatalf("-storm.workload: unknown shape %q: want storm or %s", shape, shapePreempt)
	}
	return w
}

// shapeName is w's shape as -storm.workload names it.
func shapeName(w Workload) string {
	if w.Shape == "" {
		return "storm"
	}
	return w.Shape
}

// schedVariant is one of the schedulers compared: a build of cmd/scheduler
// with the feature gate on or off.
type schedVariant struct {
	name  string // as in -storm.variants and the results
	build string // variant.Upstream, variant.Limiter or variant.Dispatch
	async bool   // SchedulerAsyncAPICalls
	// dispatcher is what the binary must say it links.
	dispatcher string
}

// schedVariants are the schedulers, in the order they run.
var schedVariants = []schedVariant{
	{name: "sync", build: variant.Upstream, async: false, dispatcher: "upstream"},
	{name: "upstream", build: variant.Upstream, async: true, dispatcher: "upstream"},
	{name: "limiter", build: variant.Limiter, async: true, dispatcher: "limiter"},
	{name: "dispatch", build: variant.Dispatch, async: true, dispatcher: "dispatch"},
}

// TestStorm is kubernetes#135900 in the real kube-scheduler. For each
// priority variant and each scheduler it runs the workload on a fresh
// kube-apiserver (all of them on one etcd, each under a prefix of its own):
// the nodes; the storm's pods; the scheduler, in a process of its own
// (cmd/scheduler, built by package variant), which finds them all in its
// first list; then, once the storm's first status patch lands, the
// schedulable pods at a steady rate. It waits until every schedulable pod is bound and
// every unschedulable one carries PodScheduled=False, and stops the
// scheduler.
//
// Every run must keep the invariants (checkRun). The ordering is checked
// too (checkOrdering, checkOvertaking): with dispatch inside, every
// schedulable pod is bound before the patch backlog drains; with
// upstream's dispatcher, at the storm's priority the median binding lands
// behind more than a third of the storm, and at high priority upstream's
// bindings are overtaken by more status patches than dispatch's (the bug,
// reproduced: without it the dispatch check would prove nothing). The
// preempt shape (-storm.workload=preempt) checks that every preemptor
// took a victim's place (checkPreemption) and its own ordering
// (checkPreemptOrdering, checkPreemptAgainstUpstream). CI's size runs both shapes, each a subtest
// named by its shape; the full size runs the storm unless -storm.workload
// says otherwise. Wall time is measured, logged and written out with
// -storm.out, never asserted.
func TestStorm(t *testing.T) {
	ws := workloads(t)
	variants, err := selectedVariants()
	require.NoError(t, err)
	priorities := strings.Split(*prioritiesFlag, ",")
	for _, p := range priorities {
		if p != "high" && p != "same" {
			t.Fatalf("-storm.priorities: unknown variant %q: want high or same", p)
		}
	}

	require.NotNil(t, prebuilt, "TestMain built no scheduler")
	for _, line := range prebuilt.log {
		t.Log(line)
	}
	require.NoError(t, prebuilt.err)
	etcd := apiserver.StartEtcd(t)

	if len(ws) == 1 {
		stormShape(t, etcd, variants, priorities, ws[0], *outFlag)
		return
	}
	// Several shapes: one subtest each, and with -storm.out a directory
	// each, named by the shape.
	for _, w := range ws {
		t.Run(shapeName(w), func(t *testing.T) {
			out := *outFlag
			if out != "" {
				out = filepath.Join(out, shapeName(w))
			}
			stormShape(t, etcd, variants, priorities, w, out)
		})
	}
}

// stormShape is TestStorm for one workload: every priority variant and
// scheduler, one subtest each, and the checks across them; with out set,
// the results, the pictures and the schedulers' logs go into that
// directory.
func stormShape(t *testing.T, etcd *apiserver.Etcd, variants []schedVariant, priorities []string, w Workload, out string) {
	t.Helper()
	var names []string
	for _, v := range variants {
		names = append(names, v.name)
	}
	t.Logf("workload: %s; schedulers: %s; priorities: %s", describe(w), strings.Join(names, ","), strings.Join(priorities, ","))

	var results []*Result
	for _, prio := range priorities {
		for _, v := range variants {
			t.Run(prio+"/"+v.name, func(t *testing.T) {
				bin := prebuilt.bins[v.build]
				if bin.err != nil {
					t.Skipf("no %s build: %v", v.build, bin.err)
				}
				r := runStorm(t, etcd, bin.path, v, prio, w, out)
				results = append(results, r)
				checkRun(t, r)
				if w.Shape == shapePreempt {
					checkPreemption(t, r)
					checkPreemptOrdering(t, r)
				} else {
					checkOrdering(t, r)
				}
			})
		}
	}
	if len(results) == 0 {
		return
	}
	if w.Shape == shapePreempt {
		checkPreemptAgainstUpstream(t, results)
	} else {
		checkOvertaking(t, results)
	}
	t.Logf("results, from the server (the test's informer and the proxy):\n%s", table(results))
	if w.Shape == shapePreempt {
		t.Logf("the preemptions:\n%s", preemptTable(results))
	}
	if out != "" {
		require.NoError(t, writeResults(out, results))
		t.Logf("wrote results.json, results.md and the pictures into %s", out)
	}
}

// binary is a built scheduler, or why it is missing.
type binary struct {
	path string
	err  error
}

// built is what TestMain built for TestStorm.
type built struct {
	bins map[string]binary // by build
	log  []string          // how long each took
	err  error             // a build that failed
}

// prebuilt is set by TestMain when TestStorm is to run.
var prebuilt *built

// buildSchedulers builds cmd/scheduler into dir once for each build the
// variants use, with the race detector when this test binary has it. A
// Dispatch build missing because the tree has no drop-in skips those runs;
// any other build failure fails TestStorm.
//
// TestMain calls it before the tests start, so that the test binary's own
// -timeout alarm covers the runs, not a cold compile of kube-scheduler
// twice. go test's watchdog, which kills a test binary running longer than
// -timeout plus a minute, counts the compile too: the README's test
// command sets -timeout 30m for it.
func buildSchedulers(ctx context.Context, dir string, variants []schedVariant) *built {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	b := &built{bins: map[string]binary{}}
	for _, v := range variants {
		if _, done := b.bins[v.build]; done {
			continue
		}
		start := time.Now()
		modfile, err := variant.Modfile(ctx, v.build, filepath.Join(dir, v.build))
		if errors.Is(err, variant.ErrNoDropIn) {
			b.bins[v.build] = binary{err: err}
			b.log = append(b.log, fmt.Sprintf("build %s: %v", v.build, err))
			continue
		}
		if err == nil {
			path := filepath.Join(dir, "scheduler-"+v.build)
			if err = variant.Build(ctx, modfile, "./cmd/scheduler", path, raceEnabled, variant.Tags(v.build)...); err == nil {
				b.bins[v.build] = binary{path: path}
				b.log = append(b.log, fmt.Sprintf("build %s: cmd/scheduler built in %v, before the tests (race detector: %v)",
					v.build, time.Since(start).Round(time.Second), raceEnabled))
				continue
			}
		}
		b.err = fmt.Errorf("build %s: %w", v.build, err)
		return b
	}
	return b
}
