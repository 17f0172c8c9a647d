package kube

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
)

// event is a point in the storm's one total order: a binding submitted, or
// a request started at the server.
type event struct {
	kind string // "submit/binding", "patch/status", "create/binding"
	name string
	at   time.Time
}

// The preset's defaults the storm runs with (Options.Workers, Options.QPS).
const (
	stormWorkers = 16
	stormQPS     = 50
)

// stormResult is what a storm run observed.
type stormResult struct {
	events []event
	// overtaken[i] counts the status patches that started at the server
	// after binding i was submitted and before it started, by the clock:
	// the patches it waited behind.
	overtaken []int
	// waited[i] is binding i's time from submission to its request.
	waited []time.Duration
	// ahead[i] counts the bindings submitted before binding i that had not
	// started when it was submitted.
	ahead          []int
	maxPatchFlight int
	maxFlight      int
	lastBindDone   time.Time
	lastPatchStart time.Time
	stats          dispatch.Stats
}

// runStorm posts 5000 status patches for 5000 pods and, while they are
// queued, submits 50 bindings, against a fake API with 20ms latency, under
// synctest's clock, every submission with so. It returns the order in
// which things happened.
func runStorm(t *testing.T, o Options, so SubmitOptions) stormResult {
	const (
		patches = 5000
		binds   = 50
		latency = 20 * time.Millisecond
	)
	var res stormResult
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI()
		api.latency = latency
		var pods, bound []string
		for i := range patches {
			pods = append(pods, api.add(newPod(fmt.Sprintf("p%d", i))).Name)
		}
		for i := range binds {
			bound = append(bound, api.add(newPod(fmt.Sprintf("b%d", i))).Name)
		}
		api.onStart = func(kind, name string, inFlight map[string]int) {
			res.events = append(res.events, event{kind, name, time.Now()})
			res.maxPatchFlight = max(res.maxPatchFlight, inFlight["patch/status"])
			res.maxFlight = max(res.maxFlight, inFlight["patch/status"]+inFlight["create/binding"])
			if kind == "patch/status" {
				res.lastPatchStart = time.Now()
			}
		}
		d := newTestDispatcher(t, api, o)
		post := func(from, to int) {
			for _, name := range pods[from:to] {
				require.NoError(t, d.Post(PatchStatus(api.pod(name), StatusPatch{Conditions: []v1.PodCondition{unschedulable("0/100 nodes are available")}}), so))
			}
		}
		// A storm already queued, then a binding every 40ms with more
		// patches between them.
		post(0, 1000)
		var tickets []*Ticket
		for i, name := range bound {
			time.Sleep(40 * time.Millisecond)
			post(1000+i*80, 1000+(i+1)*80)
			tk, err := d.Submit(t.Context(), Bind(api.pod(name), "n1"), so)
			require.NoError(t, err)
			api.mu.Lock()
			res.events = append(res.events, event{"submit/binding", name, time.Now()})
			api.mu.Unlock()
			tickets = append(tickets, tk)
		}
		for _, tk := range tickets {
			r := outcome(t, tk)
			require.Equal(t, dispatch.StateSucceeded, r.State, "%v", r.Err)
		}
		res.lastBindDone = time.Now()
		res.stats = closeD(t, d) // drains every patch
		assert.Equal(t, patches, api.count("patch/status"), "every patch written once")
		assert.Equal(t, binds, api.count("create/binding"))
		assert.Equal(t, uint64(patches), res.stats.Calls[dispatch.StateSucceeded]-binds)
		for _, name := range bound {
			assert.Equal(t, "n1", api.pod(name).Spec.NodeName)
		}
	})
	// Order by synctest's clock, not by the order goroutines recorded
	// events in: things that happen at one instant race to record.
	submitted, started := map[string]time.Time{}, map[string]time.Time{}
	var order []string
	for _, e := range res.events {
		switch e.kind {
		case "submit/binding":
			submitted[e.name] = e.at
			order = append(order, e.name)
		case "create/binding":
			started[e.name] = e.at
		}
	}
	for _, name := range order {
		from, to := submitted[name], started[name]
		n := 0
		for _, p := range res.events {
			if p.kind == "patch/status" && p.at.After(from) && p.at.Before(to) {
				n++
			}
		}
		res.overtaken = append(res.overtaken, n)
		res.waited = append(res.waited, to.Sub(from))
		a := 0
		for _, other := range order {
			if submitted[other].Before(from) && started[other].After(from) {
				a++
			}
		}
		res.ahead = append(res.ahead, a)
	}
	require.Len(t, res.overtaken, 50)
	t.Logf("bindings: most patches waited behind %d, longest wait %v; last binding done at +%v, last patch started at +%v",
		slices.Max(res.overtaken), slices.Max(res.waited), res.lastBindDone.Sub(res.events[0].at).Round(time.Millisecond), res.lastPatchStart.Sub(res.events[0].at).Round(time.Millisecond))
	return res
}

// TestStorm is kubernetes#135900: a storm of 5000 status patches with 50
// bindings arriving during it. With the preset, no binding waits behind a
// patch for a free worker — status patches may not hold the workers kept
// for bindings — nor for a rate-limit token — the next token goes to the
// best call waiting — and every binding is done while thousands of
// patches are still queued. The assertions are on order and counts, on
// synctest's clock; the FIFO run shows what they guard against.
func TestStorm(t *testing.T) {
	t.Run("preset, no rate limit", func(t *testing.T) {
		// Aging slowed down, so that no patch waits long enough to become
		// urgent and use a kept worker: then patches hold at most the rest.
		r := runStorm(t, Options{QPS: -1, Aging: time.Hour}, SubmitOptions{})
		for i, n := range r.overtaken {
			assert.Zero(t, n, "binding %d started after %d patches that were submitted before it", i, n)
			assert.Zero(t, r.waited[i], "binding %d waited for a worker", i)
		}
		kept := stormWorkers / 4
		assert.Equal(t, stormWorkers-kept, r.maxPatchFlight, "patches never held the kept workers")
		assert.True(t, r.lastBindDone.Before(r.lastPatchStart), "binds done before the patch backlog drained")
	})
	t.Run("preset, dispatcher rate limit 50 qps burst 100", func(t *testing.T) {
		// The dispatcher takes each token before it picks the call, so a
		// binding waits for the next token, and one more for each binding
		// ahead of it — never for a patch.
		r := runStorm(t, Options{}, SubmitOptions{})
		interval := time.Second / stormQPS
		for i, n := range r.overtaken {
			assert.Zero(t, n, "binding %d waited behind %d patches", i, n)
			assert.LessOrEqual(t, r.waited[i], time.Duration(r.ahead[i]+1)*interval, "binding %d: %d bindings ahead", i, r.ahead[i])
		}
		assert.LessOrEqual(t, r.maxPatchFlight, stormWorkers-stormWorkers/4)
		assert.True(t, r.lastBindDone.Before(r.lastPatchStart), "binds done before the patch backlog drained")
	})
	t.Run("FIFO: one priority, no cap", func(t *testing.T) {
		// The same storm with every call at one priority, in one tenant,
		// uncapped, is upstream's FIFO: each binding waits for the backlog
		// ahead of it.
		r := runStorm(t, Options{
			QPS:        -1,
			Priorities: map[CallType]int{PodBinding: 0}, // the status patches'
			Start:      dispatch.StartPolicy{ReservedWorkers: -1},
		}, SubmitOptions{Tenant: "all"})
		for i, n := range r.overtaken {
			assert.Greater(t, n, 500, "FIFO binding %d overtaken by only %d patches", i, n)
		}
		assert.Equal(t, stormWorkers, r.maxFlight)
	})
}
