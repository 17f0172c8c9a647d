package differential

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCloseWithCallsInFlight: Close cancels the calls in flight, as
// upstream's does, and each one's OnFinish gets what its Execute returned
// (here the cancellation its request saw), as upstream's sends it.
//
// The cancellation's cause differs by design, and is excused here
// (kube/scheduler README, "Bounds and ends"; TestCloseCancelsWithItsCause
// there): the drop-in's executions see dispatch.ErrClosed as the cause
// (context.Cause, which net/http's transport returns), where upstream's
// see context.Canceled.
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
			3  #2 finished: error: context canceled
			3  metrics: pod_binding error +1
			4  server: p0 {}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			theirs, ours := playScript(t, 1, allExcusals, tc.script)
			if !assert.Equal(t, lines(tc.want), theirs, "upstream's trace is not what its rules give: a harness bug?\nscript:\n%s", tc.script) {
				return
			}
			for i, l := range ours {
				ours[i] = strings.ReplaceAll(l, "error: dispatch: closed", "error: context canceled")
			}
			compare(t, tc.script, theirs, ours, "")
		})
	}
}
