// Package kube runs a Kubernetes scheduler's or controller's pod writes —
// status patches, bindings, preemption deletions — through the dispatch
// library: off the hot loop, coalesced per pod, by priority, bounded, retried
// with judgement, with one outcome for every submission. It is the client-go
// adapter of dispatch and gives what kube-scheduler's APIDispatcher
// (KEP-5229: pkg/scheduler/backend/api_dispatcher and
// pkg/scheduler/framework/api_calls) gives — relevance, merging, no-op
// skipping, SyncObject — plus the priority, in-flight caps, rate limiting,
// deadlines, retries and rollback it lacks.
//
// # Mental model
//
// A Call is one write on one pod, built from the pod as you last saw it:
//
//   - PatchStatus sets conditions (PodScheduled=False with the reason, say)
//     and nominatedNodeName through a strategic-merge patch on pods/status;
//   - Bind assigns the pod to a node through pods/binding;
//   - Delete deletes the pod (a preemption victim), first patching a
//     DisruptionTarget condition onto it if given one.
//
// Every write is fenced by the pod's UID — the binding's and the
// deletion's UID precondition, a status patch's metadata.uid — so a call
// never writes to a newer pod that took its pod's name: a status patch or
// binding whose pod was replaced ends Failed, and a deletion whose pod is
// gone, deleted or replaced, has met its goal and ends Succeeded.
//
// Calls are keyed by pod UID: one lane per pod, so every write to a pod
// happens in order, at most one at a time. While a call waits, later calls
// for the same pod coalesce into it by relevance, as in kube-scheduler:
// deletion > binding > status patch. A more relevant call replaces the
// pending one (and its submitters share the outcome of the call that runs:
// a binding a deletion replaced ends Succeeded with the deletion, its
// Result's Call the deletion); a less relevant one ends Skipped at once,
// without waiting; two status patches combine into one write, the newer
// one's fields winning. A call that arrives while the pod's call is in
// flight waits behind it and runs next, unless that call is a deletion
// that lands: the pod is gone, and the call ends Skipped, as it would onto
// a pending deletion.
//
// Every call carries a baseline — the pod's status, resourceVersion and node
// as last seen. A status patch that changes nothing in it, a binding
// whose baseline already shows the pod on its node, and a deletion whose
// baseline shows the pod being deleted, are never sent: they end Skipped,
// which counts as success. A status patch sends the baseline's
// resourceVersion as a precondition, so one computed from a stale view —
// a PodScheduled=False racing a successful bind (kubernetes#139602) — is
// refused by the server instead of landing; the dispatcher then reads the
// pod back and rebuilds the patch, dropping a PodScheduled=False or a
// nomination once the pod is bound. Dispatcher.SyncObject refreshes a pending
// call's baseline from your informer (unless the call already holds a newer
// view: the response of the write before it, which the informer has not
// delivered yet) and tells you how the pod will look once the call lands;
// where the informer already shows what the server decided — the pod bound
// to another node than a pending binding's — the server's truth wins over a
// call that cannot land.
//
// # Errors and retries
//
// Classify judges errors: 429, timeouts, 5xx and broken connections are
// retried with backoff — a server's Retry-After is the backoff, whether it
// answers a write or the read a retry makes first; 409 is resolved by
// reading the pod back before anything is sent again (a binding whose
// earlier attempt landed ends Succeeded without binding twice; one whose
// pod is bound elsewhere, being deleted or gated ends Failed); auth,
// validation and NotFound errors fail at once, except that a deletion whose pod is gone (NotFound,
// or the server's refusal of its UID preconditions) has succeeded. Retries
// wait in the dispatcher's queue, never in a worker: with a clientset built
// from a rest.Config, the adapter turns client-go's own retry loop off for
// its requests, so that the server's delay comes back to the dispatcher
// instead of being slept out inside the worker.
//
// # The preset
//
// NewDispatcher wires all of this into a dispatch.Dispatcher, with defaults
// for a scheduler: bindings run before deletions before status patches
// (priorities 20, 10, 0, each in a priority band of its own, so that aging
// never lifts an old status patch past a binding or a deletion: a binding
// waits for one token, however long the storm); each call type is its own
// tenant; a quarter of the workers (at least one; none of a single
// worker: Options.Start) is kept for bindings and deletions, so that, with
// more than one worker, a storm of status patches never leaves a binding
// without a worker (kubernetes#135900); and the API rate (50 qps, burst 100:
// kube-scheduler's client defaults) is limited by the dispatcher, which
// hands each token to the best call waiting when it is granted — give the
// clientset no limit of its own (RESTConfig).
//
// Options holds the preset's own settings and the dispatch settings that
// make sense for pod writes, under their dispatch.Config names and types;
// the merge, no-op, label and before-retry rules are the preset's. ModeOf
// and SetEnabled map a feature gate to the dispatcher's mode: off is Sync,
// each write made inline by its caller through the same machinery.
//
// # Logging
//
// The dispatcher logs through Options.Logger (klog's by default) at
// kube-scheduler's verbosities for the same events, so that a scheduler's
// -v shows the same writes with the preset as without it: at 3, each
// binding, deletion and condition or nomination a write sets, as it is
// sent; at 5, a call not sent because it would change nothing; at 2,
// a deletion whose pod was already gone; and as an error, a status patch
// that failed for good — nobody waits on one, so the log is where its
// failure shows. A binding's or a deletion's failure is its submitter's
// to report: it is in the Ticket's Result. Retries, drops and the rest are
// the Observer's, for metrics.
//
// # Adoption
//
//	cs, err := kubernetes.NewForConfig(kube.RESTConfig(restConfig))
//	d, err := kube.NewDispatcher(cs, kube.Options{
//		Rollout: dispatch.RolloutPolicy{Mode: kube.ModeOf(gateEnabled)},
//		Logger:  logger,
//	})
//	defer d.Close(ctx)
//
//	// Every write of one scheduling attempt carries its number: a newer
//	// attempt's write supersedes an older one's, and an older one's is
//	// refused (dispatch.ErrStale) while a newer one's is queued or in flight.
//	// Scheduling cycle: report a failure without waiting for the API.
//	d.Post(kube.PatchStatus(pod, kube.StatusPatch{Conditions: []v1.PodCondition{cond}}), kube.SubmitOptions{Generation: attempt})
//	// Binding cycle: bind, and wait for the outcome.
//	t, err := d.Submit(ctx, kube.Bind(pod, node), kube.SubmitOptions{Generation: attempt})
//	res, err := t.Wait(ctx) // res.State: Succeeded, Failed (res.Err), ...
//	// Informer update handler: see the pod as the pending write leaves it.
//	pod, err = d.SyncObject(pod)
//
// # Concurrency
//
// A Dispatcher is safe for concurrent use, as dispatch.Dispatcher is. A Call
// is an immutable value, safe to copy and share. Classify, RESTConfig and the
// constructors are pure functions.
package kube
