package differential

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCloseWithCallsInFlight: Close cancels the calls in flight, as
// upstream's does, and each one's OnFinish gets what its Execute returned
// (the cancellation its request saw, or what the Execute made of it), as
// upstream's sends it.
//
// The cancellation's cause differs by design, and is excused (closeEnds;
// kube/scheduler README, "Bounds and ends"; TestCloseCancelsWithItsCause
// there): the drop-in's executions see dispatch.ErrClosed as the cause
// (context.Cause, which net/http's transport returns), where upstream's
// see context.Canceled. So a call that retries inside its Execute with
// client-go's retry.OnError, which takes context.Canceled for an
// interruption and returns the error before it, ends with that error
// through upstream's dispatcher, and with the cause through the drop-in
// (TestCloseInterruptsRetryOnError there).
func TestCloseWithCallsInFlight(t *testing.T) {
	for _, tc := range []scriptCase{{
		name: "a status patch in flight",
		script: script{
			run(),
			hold(0),
			add(patch(0, none, unschedulable)),
			closeDispatcher(),
		},
		want: `
			2  Add #2: ok
			2  p0: patch status PodScheduled{reason=Unschedulable,status=False} → error: context canceled (held, answered at 3)
			3  Close
			3  #2 finished: error: context canceled
			3  metrics: pod_status_patch error +1
			4  server: p0 {}`,
	}, {
		name: "a binding in flight",
		script: script{
			run(),
			hold(0),
			add(bind(0, "node-1")),
			closeDispatcher(),
		},
		want: `
			2  Add #2: ok
			2  p0: bind node-1 → error: context canceled (held, answered at 3)
			3  Close
			3  #2 finished: error: context canceled
			3  metrics: pod_binding error +1
			4  server: p0 {}`,
	}, {
		// Upstream's status patch retries a 409 inside its Execute
		// (retry.OnError), which takes upstream's cancellation for an
		// interruption and returns the 409 before it; the drop-in's call
		// ends with its cause, dispatch.ErrClosed (closeEnds).
		name: "a status patch retrying a 409",
		script: script{
			run(),
			hold(0),
			add(patch(0, none, unschedulable)),
			hold(0),
			releaseWith(0, answer409),
			closeDispatcher(),
		},
		want: `
			2  Add #2: ok
			2  p0: patch status PodScheduled{reason=Unschedulable,status=False} → 409 (held, answered at 4)
			4  p0: patch status PodScheduled{reason=Unschedulable,status=False} → error: context canceled (held, answered at 5)
			5  Close
			5  #2 finished: 409
			5  metrics: pod_status_patch error +1
			6  server: p0 {}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			theirs, _ := playScript(t, 1, allExcusals&^closeEnds, tc.script)
			if !assert.Equal(t, lines(tc.want), theirs, "upstream's trace is not what its rules give: a harness bug?\nscript:\n%s", tc.script) {
				return
			}
			theirs, ours := playScript(t, 1, allExcusals, tc.script)
			compare(t, tc.script, theirs, ours, "")
		})
	}
}
