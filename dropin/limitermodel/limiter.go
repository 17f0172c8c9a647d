// Package apidispatcher, in this directory, is the part of a model of
// kubernetes/kubernetes#142123 — upstream's proposed fix for
// kubernetes#135900 — that is not upstream's code: a limiter of the
// scheduling failure handler's status patches, at most
// DefaultFailureHandlerParallelism of them in flight, which bindings,
// preemption's nominations and other calls bypass. It is a model, written
// from the proposal's description, not the proposal's code.
//
// The materialiser (package upstream in the directory above) writes this
// file into its copy of k8s.io/kubernetes, in
// pkg/scheduler/backend/api_dispatcher, behind the build tags
// dispatch_upstream and dispatch_upstream_limiter (LimiterTag), beside a
// copy of upstream's api_dispatcher.go with two lines changed: its Run
// gives the dispatcher's context a limiter (withFailureHandlerLimiter), and
// each call's goroutine takes a slot of it before it executes the call and
// gives it back when it ends (acquireFailureHandlerSlot). So a build with
// both tags is upstream's dispatcher as released — its queue, its goroutine
// per call, its metrics, its order — with the limiter, and nothing else.
//
// What the model keeps of the proposal: the limit (4), what it limits (the
// failure handler's status patches: a patch carrying a condition, the
// failure handler's PodScheduled=False), and what bypasses it (bindings, a
// patch that nominates a node for preemption, a patch without a condition
// — preemption's clearing of a nomination — and any plugin's call). What it
// cannot tell: whether the pod is a pod-group member, which the proposal
// also lets through; a status patch call carries no pod spec. Neither the
// storm nor the scheduler_perf workloads have pod groups. Where the
// limiter sits is the model's reading of the description: the call has
// left upstream's queue (the queue counts it in flight) and waits for a
// slot on its goroutine, in the order the calls were popped, so the pop
// loop never waits and a binding popped behind a thousand waiting patches
// starts at once — and then waits in client-go's token bucket behind the
// patches already admitted.
package apidispatcher

import (
	"context"
	"reflect"

	fwk "k8s.io/kube-scheduler/framework"
)

// DefaultFailureHandlerParallelism is the most failure-handler status
// patches executing at once, as the proposal sets it.
const DefaultFailureHandlerParallelism = 4

// podStatusPatch is upstream's call type of a status patch
// (pkg/scheduler/framework/api_calls.PodStatusPatch).
const podStatusPatch fwk.APICallType = "pod_status_patch"

// failureHandlerLimiterKey carries a dispatcher's limiter in the context
// its Run makes for the calls' executions.
type failureHandlerLimiterKey struct{}

// withFailureHandlerLimiter returns ctx with a limiter of its own, for one
// dispatcher's Run: slots are a buffered channel's places, and a blocked
// send is served in the order the senders arrived.
func withFailureHandlerLimiter(ctx context.Context) context.Context {
	return context.WithValue(ctx, failureHandlerLimiterKey{}, make(chan struct{}, DefaultFailureHandlerParallelism))
}

// acquireFailureHandlerSlot waits, if call is a failure handler's status
// patch, for a slot of the limiter in ctx, and returns what gives it back.
// Any other call, or a context without a limiter, passes at once. If ctx
// ends while the call waits — the dispatcher is closed — it returns
// without a slot, and the call's Execute fails on the cancelled context,
// as upstream's calls do after Close.
func acquireFailureHandlerSlot(ctx context.Context, call fwk.APICall) (release func()) {
	slots, _ := ctx.Value(failureHandlerLimiterKey{}).(chan struct{})
	if slots == nil || !fromFailureHandler(call) {
		return func() {}
	}
	select {
	case slots <- struct{}{}:
		return func() { <-slots }
	case <-ctx.Done():
		return func() {}
	}
}

// fromFailureHandler tells whether call is a status patch that the
// limiter holds: a patch carrying a condition (the failure handler sets
// PodScheduled=False) that does not nominate a node (preemption's
// nominations bypass). Upstream's PodStatusPatchCall keeps both in
// unexported fields, which are read here by reflection, read-only; a call
// of another shape is not held. The call has left upstream's queue when
// this runs, so nothing merges into it meanwhile.
func fromFailureHandler(call fwk.APICall) bool {
	if call.CallType() != podStatusPatch {
		return false
	}
	v := reflect.ValueOf(call)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	v = v.Elem()
	conditions := v.FieldByName("newConditions")
	if conditions.Kind() != reflect.Slice || conditions.Len() == 0 {
		return false
	}
	ni := v.FieldByName("nominatingInfo")
	if ni.Kind() == reflect.Pointer && !ni.IsNil() && ni.Elem().Kind() == reflect.Struct {
		mode, node := ni.Elem().FieldByName("NominatingMode"), ni.Elem().FieldByName("NominatedNodeName")
		if mode.Kind() == reflect.Int && mode.Int() == int64(fwk.ModeOverride) && node.Kind() == reflect.String && node.String() != "" {
			return false
		}
	}
	return true
}
