package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/coalescer/dispatch"
)

// busyWorker returns a dispatcher with a single worker, held by a call to the
// key "busy" until release is called, so that the calls an example submits
// meanwhile queue up and run in a known order: the examples' output then
// does not depend on goroutine scheduling. Real dispatchers use many workers.
func busyWorker[T any](exec dispatch.ExecFunc[string, T], cfg dispatch.Config[string, T]) (d *dispatch.Dispatcher[string, T], release func()) {
	cfg.Workers = 1
	held, done := make(chan struct{}), make(chan struct{})
	d, err := dispatch.New(func(ctx context.Context, key string, call T) error {
		if key == "busy" {
			close(held)
			<-done
			return nil
		}
		return exec(ctx, key, call)
	}, cfg)
	if err != nil {
		panic(err)
	}
	var zero T
	if err := d.Post("busy", zero, dispatch.SubmitOptions{}); err != nil {
		panic(err)
	}
	<-held
	return d, sync.OnceFunc(func() { close(done) })
}

// A dispatcher takes a slow call off the caller's loop: Submit returns at
// once with a ticket, and the outcome arrives when the call has run.
func Example() {
	patch := func(ctx context.Context, pod, status string) error {
		fmt.Printf("PATCH %s: %s\n", pod, status) // the slow API write
		return nil
	}
	d, err := dispatch.New(patch, dispatch.Config[string, string]{})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())

	ctx := context.Background()
	t, err := d.Submit(ctx, "pod-a", "Unschedulable", dispatch.SubmitOptions{})
	if err != nil {
		panic(err) // ErrBackpressure, ErrClosed, ...: nothing was queued
	}
	// ... the loop goes on; later, or in another goroutine:
	res, err := t.Wait(ctx)
	fmt.Println(res.State, res.Attempts, err)
	// Output:
	// PATCH pod-a: Unschedulable
	// succeeded 1 <nil>
}

// Ready calls run by priority, highest first: a bind does not wait behind
// status patches submitted before it.
func ExampleDispatcher_Submit() {
	d, release := busyWorker(func(ctx context.Context, pod, op string) error {
		fmt.Println(op, pod)
		return nil
	}, dispatch.Config[string, string]{})
	defer d.Close(context.Background())

	ctx := context.Background()
	var tickets []*dispatch.Ticket[string, string]
	for _, s := range []struct {
		pod, op string
		prio    int
	}{
		{"pod-a", "patch-status", 0},
		{"pod-b", "patch-status", 0},
		{"pod-c", "bind", 10},
	} {
		t, err := d.Submit(ctx, s.pod, s.op, dispatch.SubmitOptions{Priority: s.prio})
		if err != nil {
			panic(err)
		}
		tickets = append(tickets, t)
	}
	release()
	var results []string
	for _, t := range tickets {
		res, _ := t.Wait(ctx)
		results = append(results, res.Key+": "+res.State.String())
	}
	fmt.Println(results)
	// Output:
	// bind pod-c
	// patch-status pod-a
	// patch-status pod-b
	// [pod-a: succeeded pod-b: succeeded pod-c: succeeded]
}

// Post is for callers that never wait: it returns no ticket, and a Post onto
// a key whose call is still pending coalesces into that call without
// allocating. The outcome reaches the completion hook (Config.OnDone) and Stats.
func ExampleDispatcher_Post() {
	d, release := busyWorker(func(ctx context.Context, pod, status string) error {
		fmt.Printf("PATCH %s: %s\n", pod, status)
		return nil
	}, dispatch.Config[string, string]{OnDone: func(r dispatch.Result[string, string]) {
		if r.Key != "busy" {
			fmt.Printf("done %s: %s, %d submissions, %d API call\n", r.Key, r.State, r.Waiters, r.Attempts)
		}
	}})

	// Three scheduling attempts fail for pod-a while its first patch still
	// waits: one API call carries the last status (without Config.Merge the
	// newest call replaces the pending one).
	for _, status := range []string{"attempt 1: 0/3 nodes", "attempt 2: 0/3 nodes", "attempt 3: 0/5 nodes"} {
		if err := d.Post("pod-a", status, dispatch.SubmitOptions{}); err != nil {
			panic(err)
		}
	}
	release()
	d.Close(context.Background()) // drains what is queued, then returns

	s := d.Stats() // counting the call that held the worker
	fmt.Println("submitted", s.Submitted, "coalesced", s.Coalesced, "executions", s.Executions)
	// Output:
	// PATCH pod-a: attempt 3: 0/5 nodes
	// done pod-a: succeeded, 3 submissions, 1 API call
	// submitted 4 coalesced 2 executions 2
}

// Patch is a status update for one object at one resourceVersion.
type Patch struct {
	ResourceVersion int
	Set             map[string]string
}

// A merge function decides how a submission joins the pending call for its
// key: here, patches to the same resourceVersion are combined field by
// field, and a patch to another version is refused rather than merged
// because it looks alike.
func ExampleConfig_merge() {
	merge := func(pending, incoming Patch) (Patch, error) {
		if pending.ResourceVersion != incoming.ResourceVersion {
			return pending, fmt.Errorf("resourceVersion %d is not %d", incoming.ResourceVersion, pending.ResourceVersion)
		}
		set := maps.Clone(pending.Set)
		maps.Copy(set, incoming.Set)
		return Patch{ResourceVersion: pending.ResourceVersion, Set: set}, nil
	}
	d, release := busyWorker(func(ctx context.Context, pod string, p Patch) error {
		fmt.Println("PATCH", pod, p.ResourceVersion, p.Set) // maps print sorted
		return nil
	}, dispatch.Config[string, Patch]{Merge: merge})
	defer d.Close(context.Background())

	ctx := context.Background()
	t1, _ := d.Submit(ctx, "pod-a", Patch{7, map[string]string{"phase": "Pending"}}, dispatch.SubmitOptions{})
	t2, _ := d.Submit(ctx, "pod-a", Patch{7, map[string]string{"reason": "Unschedulable"}}, dispatch.SubmitOptions{})
	_, err := d.Submit(ctx, "pod-a", Patch{8, map[string]string{"phase": "Running"}}, dispatch.SubmitOptions{})
	fmt.Println("refused:", errors.Is(err, dispatch.ErrMergeRejected), err)
	release()

	r1, _ := t1.Wait(ctx)
	r2, _ := t2.Wait(ctx)
	fmt.Println(r1.State, r2.State, "waiters:", r2.Waiters)
	// Output:
	// refused: true dispatch: merge rejected: resourceVersion 8 is not 7
	// PATCH pod-a 7 map[phase:Pending reason:Unschedulable]
	// succeeded succeeded waiters: 2
}

// Cancel ends everything for a key — the pod was deleted or preempted: the
// pending call is removed, and an in-flight call has its context cancelled
// (if it still finishes, it is reported Stale, never Succeeded).
func ExampleDispatcher_Cancel() {
	d, release := busyWorker(func(ctx context.Context, pod, op string) error {
		fmt.Println(op, pod)
		return nil
	}, dispatch.Config[string, string]{})
	defer d.Close(context.Background())

	ctx := context.Background()
	t, _ := d.Submit(ctx, "pod-a", "patch-status", dispatch.SubmitOptions{})
	errDeleted := errors.New("pod deleted")
	fmt.Println("cancelled:", d.Cancel("pod-a", errDeleted), "pending:", d.Busy("pod-a"))
	release()

	res, err := t.Wait(ctx)
	fmt.Println(res.State, errors.Is(err, dispatch.ErrCanceled), errors.Is(err, errDeleted))
	// Output:
	// cancelled: true pending: false
	// canceled true true
}

// Ticket.Cancel withdraws one waiter: the call goes on for the others. When
// the last waiter of a queued call leaves, the call is removed unrun.
func ExampleTicket_Cancel() {
	d, release := busyWorker(func(ctx context.Context, pod, op string) error {
		fmt.Println(op, pod)
		return nil
	}, dispatch.Config[string, string]{})
	defer d.Close(context.Background())

	ctx := context.Background()
	a, _ := d.Submit(ctx, "pod-a", "patch-status", dispatch.SubmitOptions{})
	b, _ := d.Submit(ctx, "pod-a", "patch-status", dispatch.SubmitOptions{}) // coalesces with a
	a.Cancel()
	fmt.Println("after one leaves, pending:", d.Busy("pod-a"))
	b.Cancel()
	fmt.Println("after both leave, pending:", d.Busy("pod-a"))
	release()

	ra, _ := a.Wait(ctx)
	rb, _ := b.Wait(ctx)
	fmt.Println(ra.State, rb.State)
	// Output:
	// after one leaves, pending: true
	// after both leave, pending: false
	// canceled canceled
}

// Generations fence stale work: a submission for a newer scheduling attempt
// supersedes the older one, and a late submission from the older attempt is
// refused.
func ExampleSubmitOptions_generation() {
	d, release := busyWorker(func(ctx context.Context, pod, node string) error {
		fmt.Println("bind", pod, "to", node)
		return nil
	}, dispatch.Config[string, string]{})
	defer d.Close(context.Background())

	ctx := context.Background()
	old, _ := d.Submit(ctx, "pod-a", "node-1", dispatch.SubmitOptions{Generation: 1})
	cur, _ := d.Submit(ctx, "pod-a", "node-2", dispatch.SubmitOptions{Generation: 2})
	_, err := d.Submit(ctx, "pod-a", "node-1", dispatch.SubmitOptions{Generation: 1})
	fmt.Println("late attempt 1 refused:", errors.Is(err, dispatch.ErrStale))
	release()

	ro, _ := old.Wait(ctx)
	rc, _ := cur.Wait(ctx)
	fmt.Println("attempt 1:", ro.State, "attempt 2:", rc.State)
	// Output:
	// late attempt 1 refused: true
	// bind pod-a to node-2
	// attempt 1: stale attempt 2: succeeded
}

// Capacity bounds the keys a dispatcher tracks. A new key beyond it is
// refused at once with ErrBackpressure, so memory never grows with the
// backlog; a submission that coalesces into a tracked key is still taken.
func ExampleConfig_capacity() {
	d, release := busyWorker(func(ctx context.Context, pod, op string) error { return nil },
		dispatch.Config[string, string]{Capacity: 2})
	defer d.Close(context.Background())

	// The call holding the worker is tracked key 1; pod-a is key 2.
	fmt.Println("pod-a:", d.Post("pod-a", "patch-status", dispatch.SubmitOptions{}))
	err := d.Post("pod-b", "patch-status", dispatch.SubmitOptions{})
	fmt.Println("pod-b:", errors.Is(err, dispatch.ErrBackpressure), err)
	fmt.Println("pod-a again:", d.Post("pod-a", "patch-status", dispatch.SubmitOptions{}))
	release()
	// Output:
	// pod-a: <nil>
	// pod-b: true dispatch: backpressure: capacity (depth 2)
	// pod-a again: <nil>
}

// Close stops admission at once, runs what is queued until its context
// ends, then ends the rest as Closed.
func ExampleDispatcher_Close() {
	busy := make(chan struct{})
	d, _ := dispatch.New(func(ctx context.Context, pod, op string) error {
		if pod == "busy" {
			close(busy)
			<-ctx.Done() // an API call that hangs until it is cancelled
			return ctx.Err()
		}
		fmt.Println(op, pod)
		return nil
	}, dispatch.Config[string, string]{Workers: 1})
	d.Post("busy", "", dispatch.SubmitOptions{})
	<-busy

	t, _ := d.Submit(context.Background(), "pod-a", "patch-status", dispatch.SubmitOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no time to drain
	fmt.Println("Close:", d.Close(ctx))

	res, err := t.Wait(context.Background())
	fmt.Println(res.State, errors.Is(err, dispatch.ErrClosed))
	_, err = d.Submit(context.Background(), "pod-b", "patch-status", dispatch.SubmitOptions{})
	fmt.Println("after Close:", err)
	// Output:
	// Close: context canceled
	// closed true
	// after Close: dispatch: closed
}

// Configuration errors come from New, naming the field, never later. Zero
// fields mean their defaults; a callback of the wrong type does not compile.
func ExampleNew() {
	exec := func(ctx context.Context, key string, call int) error { return nil }
	_, err := dispatch.New(exec, dispatch.Config[string, int]{Workers: -1})
	fmt.Println(err)
	_, err = dispatch.New(exec, dispatch.Config[string, int]{Retry: dispatch.RetryPolicy{Multiplier: 0.5}})
	fmt.Println(err)
	d, err := dispatch.New(exec, dispatch.Config[string, int]{})
	fmt.Println(err)
	d.Close(context.Background())
	// Output:
	// dispatch: Config.Workers: -1 must be in [0, 65536]
	// dispatch: Config.Retry.Multiplier: 0.5 must be at least 1
	// <nil>
}

// SetMode is the feature gate's lever: in Sync, each submission runs inline
// in its caller, through the same retries and outcomes, and Submit returns
// with the outcome already known.
func ExampleDispatcher_SetMode() {
	d, err := dispatch.New(func(ctx context.Context, pod, status string) error {
		fmt.Printf("PATCH %s: %s\n", pod, status)
		return nil
	}, dispatch.Config[string, string]{})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())

	ctx := context.Background()
	if err := d.SetMode(ctx, dispatch.ModeSync); err != nil { // gate off: roll back
		panic(err)
	}
	t, err := d.Submit(ctx, "pod-a", "Unschedulable", dispatch.SubmitOptions{})
	if err != nil {
		panic(err)
	}
	res, _ := t.Result() // known already: the call ran inside Submit
	fmt.Println(res.State, d.Stats().Mode)
	// Output:
	// PATCH pod-a: Unschedulable
	// succeeded sync
}

// Tenants keep one caller from starving the others: here status patches may
// hold at most one of the two workers, so a bind always finds one.
func ExampleConfig_tenants() {
	apiSlow, started := make(chan struct{}), make(chan struct{}, 2)
	d, err := dispatch.New(func(ctx context.Context, pod, op string) error {
		if op == "patch" {
			started <- struct{}{}
			<-apiSlow
		}
		fmt.Println(op, pod)
		return nil
	}, dispatch.Config[string, string]{
		Workers: 2,
		Tenants: map[string]dispatch.TenantConfig{"patch": {MaxInFlight: 1}},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, pod := range []string{"pod-a", "pod-b"} {
		if err := d.Post(pod, "patch", dispatch.SubmitOptions{Tenant: "patch"}); err != nil {
			panic(err)
		}
	}
	<-started // one patch holds a worker; the cap keeps the other queued
	t, err := d.Submit(ctx, "pod-c", "bind", dispatch.SubmitOptions{Tenant: "bind", Priority: 10})
	if err != nil {
		panic(err)
	}
	if _, err := t.Wait(ctx); err != nil {
		panic(err)
	}
	p := d.Stats().Tenants["patch"]
	fmt.Printf("patches: %d in flight, %d queued\n", p.InFlight, p.Queued)
	close(apiSlow)
	if err := d.Close(ctx); err != nil { // drains the patches, one at a time
		panic(err)
	}
	// Output:
	// bind pod-c
	// patches: 1 in flight, 1 queued
	// patch pod-a
	// patch pod-b
}

// Amend shows and rewrites what a key's pending write will do before it
// runs — kube-scheduler's SyncObject: when a newer copy of the object
// arrives, the pending write is refreshed against it, and dropped as
// Skipped if the object already looks as the write would make it.
func ExampleDispatcher_Amend() {
	type patch struct{ have, want string } // the status seen, the status to write
	d, release := busyWorker(func(ctx context.Context, pod string, p patch) error {
		fmt.Println("PATCH", pod, p.want)
		return nil
	}, dispatch.Config[string, patch]{
		NoOp: func(pod string, p patch) bool { return p.want != "" && p.have == p.want },
	})
	defer d.Close(context.Background())
	ctx := context.Background()

	a, _ := d.Submit(ctx, "pod-a", patch{have: "Pending", want: "Unschedulable"}, dispatch.SubmitOptions{})
	b, _ := d.Submit(ctx, "pod-b", patch{have: "Pending", want: "Unschedulable"}, dispatch.SubmitOptions{})

	// An informer delivers pod-b, already Unschedulable (someone else wrote
	// it): refresh the pending write's baseline.
	var future string
	found, err := d.Amend("pod-b", func(p patch) (patch, error) {
		p.have = "Unschedulable"
		future = p.want // what the cache should show
		return p, nil
	})
	fmt.Println("pod-b pending:", found, err, "will be", future)

	release()
	ra, _ := a.Wait(ctx)
	rb, _ := b.Wait(ctx)
	fmt.Println("pod-a:", ra.State, "pod-b:", rb.State)
	// Output:
	// pod-b pending: true <nil> will be Unschedulable
	// PATCH pod-a Unschedulable
	// pod-a: succeeded pod-b: skipped
}
