// Package schedout is what the storm's scheduler command (cmd/scheduler)
// writes to its standard output, one JSON [Line] at a time, and what the
// storm test reads.
package schedout

// The events a [Line] reports.
const (
	// Ready: the informers have synced and the scheduling loop runs.
	Ready = "ready"
	// Counters: the answer to SIGUSR1, what the scheduler has counted so
	// far (in Counters), while it runs on.
	Counters = "counters"
	// Stopped: the scheduling loop has returned after SIGTERM or SIGINT;
	// Counters holds what the scheduler counted.
	Stopped = "stopped"
)

// Line is one line of the scheduler command's standard output.
type Line struct {
	// Event is [Ready], [Counters] or [Stopped].
	Event string `json:"event"`
	// Dispatcher names the APIDispatcher linked in: "dispatch" when the
	// binary contains github.com/coalescer/dispatch (the drop-in),
	// "upstream" otherwise.
	Dispatcher string `json:"dispatcher,omitempty"`
	// Async says whether SchedulerAsyncAPICalls is on; without it the
	// scheduler uses no dispatcher at all.
	Async bool `json:"async,omitempty"`
	// Kubernetes is where k8s.io/kubernetes came from: its version, and
	// the directory that replaced it, if one did.
	Kubernetes string `json:"kubernetes,omitempty"`
	// Counters holds the scheduler's metrics that say what it did:
	// scheduling attempts by result, async API calls by call type and
	// result, and those pending; and, to say where the time went, the
	// sum (seconds) and count of four histograms: scheduling attempts,
	// the pod scheduling SLI (queue entry → bound), async calls'
	// executions, and the Bind extension point (with the gate on: a
	// binding's Add → outcome). Keys are "metric{label=value,...}",
	// "metric_sum{...}" and "metric_count{...}".
	Counters map[string]float64 `json:"counters,omitempty"`
}

// ScheduledKey is the key in Counters of the pods the scheduler bound.
const ScheduledKey = "scheduler_schedule_attempts_total{profile=default-scheduler,result=scheduled}"
