package differential

import (
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// scriptCase is a script with upstream's trace as call_queue.go's rules
// give it, worked out by hand: the harness is checked against upstream
// first, then the drop-in against upstream.
type scriptCase struct {
	name   string
	script script
	want   string  // upstream's trace, one event a line (see side.trace)
	shown  excusal // for a known difference: the excusal not applied
}

// TestScripts runs each case through both dispatchers: upstream must give
// the trace its rules give, and the drop-in the same.
func TestScripts(t *testing.T) {
	for _, tc := range scriptCases {
		t.Run(tc.name, func(t *testing.T) {
			theirs, ours := playScript(t, 1, allExcusals, tc.script)
			if !assert.Equal(t, lines(tc.want), theirs, "upstream's trace is not what its rules give: a harness bug?\nscript:\n%s", tc.script) {
				return
			}
			compare(t, tc.script, theirs, ours, "")
		})
	}
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, strings.TrimSpace(l))
	}
	return out
}

var scriptCases = []scriptCase{{
	name: "before Run a binding overwrites a pending status patch, and a later one is skipped",
	script: script{
		add(patch(0, none, unschedulable)),
		add(bind(0, "node-1")),
		add(patch(0, none, unschedulable)),
		run(),
	},
	want: `
		  0  Add #0: ok
		  1  Add #1: ok
		  1  #0 finished: overwritten
		  2  Add #2: skipped
		  2  #2 finished: skipped
		  3  p0: bind node-1 → ok
		  3  #1 finished: ok
		  3  metrics: pod_binding success +1
		  4  server: p0 {}`,
}, {
	name: "calls less relevant than the binding in flight are skipped",
	script: script{
		run(),
		hold(0),
		add(bind(0, "node-1")),
		add(patch(0, none, unschedulable)),
		add(label(0, none, "1")),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: bind node-1 → ok (held, answered at 5)
		3  Add #3: skipped
		3  #3 finished: skipped
		4  Add #4: skipped
		4  #4 finished: skipped
		5  #2 finished: ok
		5  metrics: pod_binding success +1
		6  server: p0 {}`,
}, {
	// Upstream syncs the newest call only and never drops a call while
	// its object has one in flight. The pending patch
	// repeats the one in flight; the one in flight fails with a 403; the
	// pending one then lands PodScheduled=False.
	name: "a status patch repeating the one in flight survives SyncObject and lands when that one fails",
	script: script{
		run(),
		hold(0),
		add(patch(0, none, unschedulable)),
		add(patch(0, none, unschedulable)),
		syncObject(0, none),
		releaseForbidden(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch status PodScheduled{reason=Unschedulable,status=False} → 403 (held, answered at 5)
		3  Add #3: ok
		4  SyncObject p0: {PodScheduled=False/Unschedulable}, ok
		5  p0: patch status PodScheduled{reason=Unschedulable,status=False} → ok
		5  #2 finished: 403
		5  #3 finished: ok
		5  metrics: pod_status_patch error +1
		5  metrics: pod_status_patch success +1
		6  server: p0 {PodScheduled=False/Unschedulable}`,
}, {
	// The no-op rule after SyncObject: the pending call is a no-op for
	// the object given, and is kept all the same while the object's call
	// is in flight. (Its Execute then finds nothing to send.)
	name: "a pending call that is a no-op after SyncObject is kept while another is in flight",
	script: script{
		run(),
		hold(0),
		add(label(0, none, "1")),
		add(patch(0, none, schedulerError)),
		syncObject(0, schErr),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch label a=1 → ok (held, answered at 5)
		3  Add #3: ok
		4  SyncObject p0: {PodScheduled=False/SchedulerError}, ok
		5  #2 finished: ok
		5  #3 finished: ok
		5  metrics: pod_status_patch success +1
		5  metrics: test_label success +1
		6  server: p0 {a=1}`,
}, {
	// A call that is a no-op once merged with the pending call is kept
	// while the object's call is in flight
	// (noOp && !inFlight), and the pending call is overwritten. A later
	// SyncObject refreshes it from the pod as the server has it, and when
	// the call in flight fails, it lands.
	name: "a status patch that is a no-op once merged is kept while another is in flight",
	script: script{
		run(),
		hold(0),
		add(patch(0, none, unschedulable)),
		add(patch(0, unsch, unschedulable)),
		add(patch(0, unsch, unschedulable)),
		syncObject(0, none),
		releaseForbidden(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch status PodScheduled{reason=Unschedulable,status=False} → 403 (held, answered at 6)
		3  Add #3: ok
		4  Add #4: ok
		4  #3 finished: overwritten
		5  SyncObject p0: {PodScheduled=False/Unschedulable}, ok
		6  p0: patch status PodScheduled{reason=Unschedulable,status=False} → ok
		6  #2 finished: 403
		6  #4 finished: ok
		6  metrics: pod_status_patch error +1
		6  metrics: pod_status_patch success +1
		7  server: p0 {PodScheduled=False/Unschedulable}`,
}, {
	// The case before, with a plugin's call, whose Execute always sends:
	// the third call runs.
	name: "a label call that is a no-op once merged is kept while another is in flight, and runs",
	script: script{
		run(),
		hold(0),
		add(label(0, none, "1")),
		add(label(0, a1, "1")),
		add(label(0, a1, "1")),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch label a=1 → ok (held, answered at 5)
		3  Add #3: ok
		3  #3 Merge(#2)
		4  Add #4: ok
		4  #4 Merge(#3)
		4  #3 finished: overwritten
		5  p0: patch label a=1 → ok
		5  #2 finished: ok
		5  #4 finished: ok
		5  metrics: test_label success +2
		6  server: p0 {a=1}`,
}, {
	// With a status patch in flight and a binding pending, SyncObject
	// syncs the binding only, whose Sync returns the
	// object as given.
	name: "SyncObject with a status patch in flight and a binding pending returns the object as given",
	script: script{
		run(),
		hold(0),
		add(patch(0, none, unschedulable)),
		add(bind(0, "node-1")),
		syncObject(0, none),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch status PodScheduled{reason=Unschedulable,status=False} → ok (held, answered at 5)
		3  Add #3: ok
		4  SyncObject p0: {}, ok
		5  p0: bind node-1 → ok
		5  #2 finished: ok
		5  #3 finished: ok
		5  metrics: pod_binding success +1
		5  metrics: pod_status_patch success +1
		6  server: p0 {PodScheduled=False/Unschedulable}`,
}, {
	// Upstream merges a call with the object's newest call, in flight or
	// not: the second patch takes the nominated node of the one in flight
	// (PodStatusPatchCall.Merge), so when that one fails with a 403, the
	// nomination still lands. (Before e52e422 the drop-in ran a call
	// arriving in flight as it was, by design: the nomination was lost.)
	name: "a status patch added while one is in flight takes its nomination, which lands when that one fails",
	script: script{
		run(),
		hold(0),
		add(nominating(0, none, unschedulable, "node-2")),
		add(patch(0, none, unschedulable)),
		releaseForbidden(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch status PodScheduled{reason=Unschedulable,status=False} nominatedNodeName=node-2 → 403 (held, answered at 4)
		3  Add #3: ok
		4  p0: patch status PodScheduled{reason=Unschedulable,status=False} nominatedNodeName=node-2 → ok
		4  #2 finished: 403
		4  #3 finished: ok
		4  metrics: pod_status_patch error +1
		4  metrics: pod_status_patch success +1
		5  server: p0 {PodScheduled=False/Unschedulable nominatedNodeName=node-2}`,
}, {
	// A call whose Merge fails is refused with Merge's error, on its
	// OnFinish too, and the newest call is left as it was: here the call
	// in flight, which a later call of its type merges with all the same.
	name: "a call whose Merge fails is refused, and the call it met stays the newest",
	script: script{
		run(),
		hold(0),
		add(labelOf(strictLabel, 0, none, "1")),
		add(labelOf(strictLabel, 0, none, "2")),
		add(label(0, none, "2")),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch label a=1 → ok (held, answered at 5)
		3  Add #3: error: failed to merge API calls: this call merges with none
		3  #3 Merge(#2)
		3  #3 finished: error: failed to merge API calls: this call merges with none
		4  Add #4: ok
		4  #4 Merge(#2)
		5  p0: patch label a=2 → ok
		5  #2 finished: ok
		5  #4 finished: ok
		5  metrics: test_label success +2
		6  server: p0 {a=2}`,
}, {
	// The type decides the relevance and whether Merge is asked: a call
	// that says it is a status patch meets upstream's PodStatusPatchCall
	// as one of its type, and each refuses the other's Merge.
	name: "calls of one type and different Go types refuse to merge",
	script: script{
		add(labelOf(impostorLabel, 0, none, "2")),
		add(patch(0, none, schedulerError)),
		run(),
	},
	want: `
		0  Add #0: ok
		1  Add #1: error: failed to merge API calls: unexpected error: call of type *differential.labelCall is not of type *PodStatusPatchCall
		1  #1 finished: error: failed to merge API calls: unexpected error: call of type *differential.labelCall is not of type *PodStatusPatchCall
		2  p0: patch label a=2 → ok
		2  #0 finished: ok
		2  metrics: pod_status_patch success +1
		3  server: p0 {a=2}`,
}, {
	// A type the relevance table does not name has relevance 0: a status
	// patch overwrites its pending call, and it is skipped behind one.
	name: "a call of a type the relevance table does not name is less relevant than a status patch",
	script: script{
		add(labelOf(otherLabel, 0, none, "2")),
		add(patch(0, none, schedulerError)),
		add(labelOf(otherLabel, 0, none, "1")),
		run(),
	},
	want: `
		0  Add #0: ok
		1  Add #1: ok
		1  #0 finished: overwritten
		2  Add #2: skipped
		2  #2 finished: skipped
		3  p0: patch status PodScheduled{reason=SchedulerError,status=False} → ok
		3  #1 finished: ok
		3  metrics: pod_status_patch success +1
		4  server: p0 {PodScheduled=False/SchedulerError}`,
}, {
	// A plugin's type may be more relevant than a binding: it overwrites
	// a pending binding, and a binding is skipped behind it.
	name: "a call more relevant than a binding overwrites a pending one, and skips the next",
	script: script{
		add(bind(0, "node-1")),
		add(labelOf(urgentLabel, 0, none, "1")),
		add(bind(0, "node-2")),
		run(),
	},
	want: `
		0  Add #0: ok
		1  Add #1: ok
		1  #0 finished: overwritten
		2  Add #2: skipped
		2  #2 finished: skipped
		3  p0: patch label a=1 → ok
		3  #1 finished: ok
		3  metrics: test_urgent success +1
		4  server: p0 {a=1}`,
}, {
	// Upstream's status patch retries a 409 inside its Execute; neither
	// dispatcher retries it, nor a 404 or an error that is no API status.
	name: "errors neither dispatcher retries end the call with the error Execute returned",
	script: script{
		run(),
		hold(0),
		add(patch(0, none, schedulerError)),
		releaseWith(0, answer409),
		hold(0),
		add(bind(0, "node-1")),
		releaseWith(0, answer404),
		hold(0),
		add(label(0, none, "1")),
		releaseWith(0, answerPlain),
	},
	want: `
		2  Add #2: ok
		2  p0: patch status PodScheduled{reason=SchedulerError,status=False} → 409 (held, answered at 3)
		3  p0: patch status PodScheduled{reason=SchedulerError,status=False} → ok
		3  #2 finished: ok
		3  metrics: pod_status_patch success +1
		5  Add #5: ok
		5  p0: bind node-1 → 404 (held, answered at 6)
		6  #5 finished: 404
		6  metrics: pod_binding error +1
		8  Add #8: ok
		8  p0: patch label a=1 → error: test: the server said no (held, answered at 9)
		9  #8 finished: error: test: the server said no
		9  metrics: test_label error +1
		10  server: p0 {PodScheduled=False/SchedulerError}`,
}, {
	// SyncObject returns what the newest call's Sync returns, as it
	// returns it: here nil, with its error, for an object not a pod.
	name: "SyncObject returns what the call's Sync returns, nil too",
	script: script{
		add(labelOf(strictLabel, 0, none, "1")),
		syncNode(0),
		run(),
	},
	want: `
		0  Add #0: ok
		1  SyncObject p0: <nil>, error: object of type *v1.Node is not a *v1.Pod
		2  p0: patch label a=1 → ok
		2  #0 finished: ok
		2  metrics: test_label success +1
		3  server: p0 {a=1}`,
}}

var known = flag.Bool("differential.known", false, "run the scripts that show the drop-in's known differences from upstream (they fail)")

// knownDifferences are scripts on which the drop-in differs from upstream
// by a difference that the comparisons excuse (see excusal). They run with
// -differential.known, to show it.
var knownDifferences = []scriptCase{{
	// Upstream's (silentReplace): the pending status patch (#3), which the
	// binding replaces while the label call is in flight, never hears
	// from upstream; the drop-in tells it ErrCallOverwritten.
	name:  "a pending call replaced by another type while the object's call is in flight",
	shown: silentReplace,
	script: script{
		run(),
		hold(0),
		add(label(0, none, "1")),
		add(patch(0, none, unschedulable)),
		add(bind(0, "node-1")),
		release(0),
	},
	want: `
		2  Add #2: ok
		2  p0: patch label a=1 → ok (held, answered at 5)
		3  Add #3: ok
		4  Add #4: ok
		5  p0: bind node-1 → ok
		5  #2 finished: ok
		5  #4 finished: ok
		5  metrics: pod_binding success +1
		5  metrics: test_label success +1
		6  server: p0 {a=1}`,
}, {
	// By design (closeEnds): the status patch queued at Close, before Run,
	// never hears from upstream; the drop-in tells it dispatch.ErrClosed.
	name:  "a call queued at Close",
	shown: closeEnds,
	script: script{
		add(patch(0, none, unschedulable)),
		closeDispatcher(),
	},
	want: `
		0  Add #0: ok
		1  Close
		2  server: p0 {}`,
}, {
	// By design (closeEnds): after Close, upstream's SyncObject still
	// syncs the call its Close left queued, which never runs; the
	// drop-in's Close ended it, and SyncObject returns the pod as given.
	name:  "SyncObject after Close",
	shown: closeEnds,
	script: script{
		add(label(0, none, "1")),
		closeDispatcher(),
		syncObject(0, none),
	},
	want: `
		0  Add #0: ok
		1  Close
		2  SyncObject p0: {a=1}, ok
		3  server: p0 {}`,
}}

// TestKnownDifferences shows the differences that the comparisons excuse,
// when asked to (-differential.known): each case fails.
func TestKnownDifferences(t *testing.T) {
	if !*known {
		t.Skip("the drop-in's known differences from upstream; run with -differential.known to see them")
	}
	for _, tc := range knownDifferences {
		t.Run(tc.name, func(t *testing.T) {
			theirs, ours := playScript(t, 1, allExcusals&^tc.shown, tc.script)
			if !assert.Equal(t, lines(tc.want), theirs, "upstream's trace is not what its rules give: a harness bug?\nscript:\n%s", tc.script) {
				return
			}
			compare(t, tc.script, theirs, ours, "known difference: ")
		})
	}
}
