// Package scheduler is an fwk.APIDispatcher (k8s.io/kube-scheduler/framework)
// on dispatch: it runs kube-scheduler's asynchronous API calls — upstream's
// PodStatusPatchCall and PodBindingCall, and any plugin's own fwk.APICall —
// with upstream's semantics and what upstream's dispatcher
// (k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher, KEP-5229) lacks:
// priority by call type with aging, the rate limit's tokens handed out in
// priority order, workers kept for bindings, retries judged by kube.Classify
// and waited out in the queue, deadlines, a bound with backpressure, a
// tenant per call type, Stats, an Observer for dispatchprom, and a run-time
// switch to the synchronous path.
//
// It is the third of dispatch's layers (core, kube, this adapter, the
// drop-in). A custom scheduler binary constructs it; the drop-in, in the
// repository's dropin/ directory (not published: it needs
// k8s.io/kubernetes), wraps it in upstream's exact API so that an
// unmodified kube-scheduler builds with it (see the module's README).
//
// # Upstream's semantics
//
// One lane per object UID (fwk.APICall.UID), and every rule is upstream's,
// against the object's newest call: the pending one, or, if none is
// pending, the one in flight (from the moment it leaves the queue until its
// end is recorded). A less relevant call (fwk.APICallRelevances) is refused
// at once with an error wrapping fwk.ErrCallSkipped, also sent on its
// OnFinish. A more relevant call, or one of another type at the same
// relevance, overwrites a pending call and runs after one in flight; a call
// of the same type absorbs the newest call through its own Merge, and takes
// a pending call's place or runs after one in flight. An overwritten
// pending call's OnFinish gets an error wrapping fwk.ErrCallOverwritten.
// The call that stays is asked IsNoOp: a no-op is dropped as skipped unless
// the object has a call in flight (that one may yet fail). A no-op call for
// an idle object is skipped at once. SyncObject refreshes the object's
// newest call from the object (its Sync), returns what that Sync returns,
// and drops a pending call that then IsNoOp unless the object has a call in
// flight. These decisions are made under the dispatcher's lock, in the step
// that admits the call. Nothing runs before Start (upstream's Run).
//
// # Priorities
//
// Each call type has a priority (Options.Priorities): pod_binding 20, a
// plugin's own types 10, pod_status_patch 0 — a pod's binding cycle waits on
// the first, perhaps on the second, never on the third. Each is in a
// priority band of its own (Options.AgingBand, 10 wide by default): a
// waiting call gains a level per Options.Aging over the calls of its band,
// and never runs before a ready call of a higher band. A quarter of the
// workers are kept for the binding's band. A call that overwrites a pending
// call of another type is another operation and starts fresh — at once, with
// every attempt of its own, in its own tenant — even if the call it replaces
// was waiting out a retry's backoff; a call of the same type that merges
// into it is the same operation, updated, and keeps the backoff.
//
// # OnFinish, and the Ticket
//
// Every Add ends in exactly one value on its OnFinish channel — never two,
// as upstream sends to a call in flight that a call of the same type merges
// with — through upstream's non-blocking send. So a channel with a free slot
// for each of its calls' results (upstream's callers make one with capacity
// 1 per call) never loses a result; an unbuffered channel nobody is receiving
// on does, as upstream documents. Submit is Add with a Ticket that keeps the
// result, and the dispatcher's Outcome (state, attempts, queue wait, run
// time), for a caller that reads late. A send on a channel its caller
// closed panics, which would crash upstream's dispatcher: here the panic is
// recovered, logged as an internal error (as a panic in Execute is) and
// counted with the dispatcher's other callback panics (Stats.CallbackPanics),
// the call's Ticket still holds its result, and every other call — one told
// in the same step included — is told, and goes on, as if nothing had
// happened.
//
// # Priority on the wire
//
// kube-scheduler's clientset carries client-go's token bucket (QPS 50, burst
// 100 by default), shared with its informers. Behind the workers, that bucket
// undoes any priority order: a worker has chosen its call before it waits
// there (kubernetes#135900). So, for a clientset built from a rest.Config,
// the adapter takes each execution's token from that very bucket itself
// before the call is chosen — a binding added during a storm of status
// patches gets the next token, not a place behind the storm — and executes
// on a clientset derived from the given one (the same HTTP client: transport,
// credentials, user agent) that has no bucket of its own; a transport wrapper
// charges that bucket for every further request of the execution (upstream's
// calls retry inside Execute). No request pays twice, nor goes unpaid: the
// server sees no more requests than the bucket grants (see below). The
// derived clientset keeps the given one's settings — content type
// (protobuf, if the scheduler asked for it), accepted types, user agent,
// timeout — except its limiter and a per-client warning handler.
//
// client-go's bucket grants tokens in the order they are asked for, so a
// user's share of it, among others that wait on it continuously, is the
// number of waits it keeps outstanding. kube-scheduler's own calls share
// the dispatcher's clientset: preemption deletes its victims on it, from a
// goroutine per victim. Upstream's dispatcher, which waits on a goroutine
// per call, has a share per call; so has the adapter: it keeps a wait on
// the bucket for each call waiting to run (up to 1 024) — except the status
// patches beyond what Options.PaceStatusPatches lets run at once, which
// would only put their tokens ahead of those deletions
// (TestPacedPatchesKeepNoWaits) — and banks each
// token granted until a call is chosen for it — the best one ready then —
// or an execution's further request takes it. With one wait at a time, a
// dozen goroutines deleting victims would leave the bindings a thirteenth
// of the bucket (TestShareOfTheBucket). The server never sees more
// requests than the bucket has granted; but tokens granted while every
// worker is busy (the server slow) wait in the bank, and go out as workers
// free up, faster than the bucket's rate — at most as many as the waits
// that were outstanding.
//
// # Paced status patches
//
// With Options.PaceStatusPatches (the drop-in sets it), the status patches
// executing at once are capped at twice the client's QPS × their average
// execution time (a moving average, each patch weighing 1/8), rounded up,
// at least 1 and at most the workers not reserved for bindings; the cap
// moves after every patch (the core's SetTenantMaxInFlight on the
// PodStatusPatch tenant). By Little's law that many in flight carry twice
// the client's rate, so a storm of patches drains at the rate the bucket
// grants — as fast as upstream's goroutine per call — however slow the
// server or the machine get, and no more of them sit at the server than
// that rate needs, so that a binding sent meanwhile does not queue there
// behind a burst of them. A constant cap of n carries only n ÷ the latency
// a second: two patches at 50 ms each are 40 a second, below
// kube-scheduler's 50, and the unschedulable pods' PodScheduled=False
// conditions, on which cluster-autoscaler scales up, land later than with
// upstream's dispatcher. When the server cannot keep the client's rate,
// the latency and so the cap rise to the workers not reserved: patches
// then use them as they would without pacing. Pacing needs the bucket the
// adapter takes its tokens from; with a client it cannot unwrap it is off.
//
// A clientset that cannot be unwrapped — the fake clientset, a wrapper whose
// CoreV1 REST client is not a *rest.RESTClient — is used as it is: its own
// limiter, if any, applies behind the workers, as with upstream's
// dispatcher. Priority still decides which call a free worker takes, and the
// reserved workers keep bindings moving.
//
// # Retries, and the bound on requests
//
// A failed execution is judged by kube.Classify (Options.Classify): 429,
// 5xx, timeouts and broken connections are retried after a backoff in the
// queue, never asleep in a worker, up to Options.Retry.MaxAttempts
// executions (default 3) and within the retry budget (by default retries are
// at most 20% of recent first attempts, at least 10 per 10 s). A server's
// Retry-After is the backoff: on the derived clientset, the transport takes
// the header off the response, so client-go's own loop — which would sleep
// it out inside the execution and resend up to ten times — does not run,
// and hands the delay to the dispatcher with the error it came with: an
// execution that ends with another error (a later response's, or its own)
// is judged, and waits, as that error says. A 409 fails the call (an
// fwk.APICall cannot be rebuilt from fresh state by the dispatcher).
//
// Upstream's PodStatusPatchCall and PodBindingCall also retry inside
// Execute (client-go's retry.DefaultBackoff: at most 4 requests, about 0.3 s
// of sleep, on 500, 503 and connection refused, and on 409 for status
// patches). So a call makes at most MaxAttempts × 4 requests — 12 by
// default — each paying its token, where upstream's makes at most 4 × 11
// (its inner loop times client-go's Retry-After loop). Bound it further
// with Options.Retry.
//
// # Logging
//
// Calls log from Execute through klog.FromContext, which carries the logger
// Start was given (upstream's calls log at V(3) and V(5)). The dispatcher
// logs its own events: its start, with its workers and where its tokens
// come from, at V(2); a retry at V(4); a queued call shed to make room at
// V(2); a change of mode or of the circuit breaker's state at V(0); and a
// panic in Execute (contained: the call fails), or in a send on a closed
// OnFinish channel, as an error.
package scheduler
