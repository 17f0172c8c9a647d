package differential

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	basemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	fwk "k8s.io/kube-scheduler/framework"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// registerExecutionMetrics makes kube-scheduler's execution metrics
// (scheduler_async_api_call_execution_total, _duration_seconds) record:
// metrics.Register registers them only with SchedulerAsyncAPICalls on, and
// unregistered they record nothing. A registry of the tests' own does.
func registerExecutionMetrics() {
	if !metrics.AsyncAPICallsTotal.IsCreated() {
		basemetrics.NewKubeRegistry().MustRegister(metrics.AsyncAPICallsTotal, metrics.AsyncAPICallDuration)
	}
}

// executions reads kube-scheduler's execution metrics, which both
// dispatchers record in the same process-wide vectors, by call type and
// result: a side marks them before its step, and reads what its step
// added (the other side's steps run between, settled).
type executions struct{ base map[execKey]execCount }

type execKey struct{ typ, result string }

// execCount is a series' executions, in the counter and in the
// histogram of durations.
type execCount struct{ total, timed float64 }

var execTypes = []fwk.APICallType{apicalls.PodStatusPatch, apicalls.PodBinding, labelCallType, otherCallType, urgentCallType}

func readExecutions() map[execKey]execCount {
	out := map[execKey]execCount{}
	for _, t := range execTypes {
		for _, r := range []string{metrics.GoroutineResultSuccess, metrics.GoroutineResultError} {
			n, err := testutil.GetCounterMetricValue(metrics.AsyncAPICallsTotal.WithLabelValues(string(t), r))
			if err != nil {
				panic(err)
			}
			h, err := testutil.GetHistogramMetricCount(metrics.AsyncAPICallDuration.WithLabelValues(string(t), r))
			if err != nil {
				panic(err)
			}
			out[execKey{string(t), r}] = execCount{n, float64(h)}
		}
	}
	return out
}

func (e *executions) mark() { e.base = readExecutions() }

// since renders what was recorded since the mark, or the last since, by
// series.
func (e *executions) since() []string {
	now := readExecutions()
	var out []string
	keys := slices.SortedFunc(maps.Keys(now), func(a, b execKey) int {
		return cmp.Or(cmp.Compare(a.typ, b.typ), cmp.Compare(a.result, b.result))
	})
	for _, k := range keys {
		n, b := now[k], e.base[k]
		if n != b {
			text := fmt.Sprintf("metrics: %s %s +%v", k.typ, k.result, n.total-b.total)
			if n.timed-b.timed != n.total-b.total {
				text += fmt.Sprintf(" (durations +%v)", n.timed-b.timed)
			}
			out = append(out, text)
		}
	}
	e.base = now
	return out
}
