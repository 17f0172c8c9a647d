// Package apidispatcher is a drop-in replacement for kube-scheduler's
// k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher, with upstream's
// exact exported API, over github.com/coalescer/dispatch/kube/scheduler.
//
// This file is what the materialise tool of
// github.com/coalescer/dispatch/dropin puts in place of that
// package's non-test files in a copy of k8s.io/kubernetes, so that
// kube-scheduler, its tests and scheduler_perf run with dispatch inside. It
// compiles here too, against the released k8s.io/kubernetes, so that it is
// built and vetted with the rest of the repository.
package apidispatcher

import (
	"context"
	"fmt"
	"time"

	"github.com/coalescer/dispatch/kube/scheduler"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// APIDispatcher queues API calls and runs them asynchronously: an
// fwk.APIDispatcher built on dispatch, with upstream's semantics plus
// priority by call type (bindings first), the rate limit's tokens handed
// out in priority order, workers kept for bindings, retries, deadlines and
// a bound. See github.com/coalescer/dispatch/kube/scheduler.
type APIDispatcher struct {
	d *scheduler.Dispatcher
}

// New returns an APIDispatcher that runs calls with client, on
// parallelization workers (kube-scheduler's parallelism; the default if not
// positive), with the relevance table apiCallRelevances. Status patches
// are paced (see below). Nothing runs before Run.
func New(client clientset.Interface, parallelization int, apiCallRelevances fwk.APICallRelevances) *APIDispatcher {
	d, err := scheduler.New(client, apiCallRelevances, scheduler.Options{
		Workers:           max(parallelization, 0),
		Metrics:           schedulerMetrics{},
		PaceStatusPatches: true,
	})
	if err != nil {
		// Only a nil client or invalid options fail, and the options are
		// fixed here: upstream's New cannot report an error either.
		panic(fmt.Sprintf("apidispatcher.New: %v", err))
	}
	return &APIDispatcher{d: d}
}

// Status patches are paced (kube/scheduler's Options.PaceStatusPatches):
// at most twice the client's QPS × their average execution time run at
// once. Bindings have workers of their own either way (the adapter's
// reservation); the pace bounds the storm's share of the server instead.
// Uncapped, the storm's first second puts a patch from every free worker
// at the server together, and a binding sent then waits behind them there:
// in the storm test (test/storm) the first bindings waited 80–105 ms for
// the server's answer with 16 patches in flight, against 6 ms for the
// median binding. A constant cap fixes that but not the rate: n in flight
// carry n ÷ the latency a second, which falls below the client's rate as
// soon as the server or the machine slow down, and the unschedulable pods'
// conditions — which cluster-autoscaler scales up on — land later than
// with upstream's dispatcher. Paced, they land at the client's rate.

// Add queues an API call. It returns an error if the call is not queued:
// one matching fwk.ErrCallSkipped when it is skipped (handle it as upstream
// documents), or the dispatcher's own when it cannot take it (full,
// closed). The call's result goes to opts.OnFinish, exactly once.
func (ad *APIDispatcher) Add(newAPICall fwk.APICall, opts fwk.APICallOptions) error {
	return ad.d.Add(newAPICall, opts)
}

// SyncObject brings obj and the pending API call for it in line, and
// returns the object as the call will leave it.
func (ad *APIDispatcher) SyncObject(obj metav1.Object) (metav1.Object, error) {
	return ad.d.SyncObject(obj)
}

// Run starts executing the queued API calls, logging to logger.
func (ad *APIDispatcher) Run(logger klog.Logger) {
	ad.d.Start(logger)
}

// Close shuts the APIDispatcher down at once: queued calls end with an
// error on their OnFinish, running calls are cancelled, and Close returns
// when they have returned.
func (ad *APIDispatcher) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = ad.d.Close(ctx)
}

// schedulerMetrics records kube-scheduler's own async-call metrics, as
// upstream's dispatcher does: each execution's result and duration by call
// type, and the calls waiting by call type.
type schedulerMetrics struct{}

func (schedulerMetrics) Executed(t fwk.APICallType, err error, elapsed time.Duration) {
	result := metrics.GoroutineResultSuccess
	if err != nil {
		result = metrics.GoroutineResultError
	}
	metrics.AsyncAPICallsTotal.WithLabelValues(string(t), result).Inc()
	metrics.AsyncAPICallDuration.WithLabelValues(string(t), result).Observe(elapsed.Seconds())
}

func (schedulerMetrics) Pending(t fwk.APICallType, n int) {
	metrics.AsyncAPIPendingCalls.WithLabelValues(string(t)).Set(float64(n))
}
