package kube

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// TestOptionsErrors: bad options are reported by NewDispatcher, naming the
// Options field the user set — never a core field the preset derived from
// it — and nothing starts.
func TestOptionsErrors(t *testing.T) {
	api := newFakeAPI()
	cases := []struct {
		name string
		o    Options
		want string
	}{
		{"QPS NaN", Options{QPS: math.NaN()}, "kube: Options.QPS NaN is not a rate"},
		{"QPS +Inf", Options{QPS: math.Inf(1)}, "Options.QPS +Inf is not a rate"},
		{"Burst negative", Options{Burst: -1}, "Options.Burst -1 must not be negative"},
		{"QPS far below the minimum", Options{QPS: 1e-300}, "Options.QPS 1e-300 is below one call a minute"},
		{"QPS just below the minimum", Options{QPS: 0.99 / 60}, "Options.QPS 0.0165 is below one call a minute"},
		{"RateLimit and QPS", Options{RateLimit: rate.NewLimiter(1, 1), QPS: 5}, "Options.RateLimit is set: leave QPS and Burst 0"},
		{"RateLimit and Burst", Options{RateLimit: rate.NewLimiter(1, 1), Burst: 5}, "Options.RateLimit is set: leave QPS and Burst 0"},
		{"a priority of no call type", Options{Priorities: map[CallType]int{"pod_eviction": 3}},
			`kube: Options.Priorities names "pod_eviction", which is not a call type`},
		{"Burst without a limit", Options{QPS: -1, Burst: 5}, "kube: Options.Burst 5 is set, but Options.QPS -1 means no limit: leave Burst 0"},
		{"StatusPatchMaxInFlight negative", Options{StatusPatchMaxInFlight: -1}, "Options.StatusPatchMaxInFlight -1 must not be negative"},
		{"StatusPatchMaxInFlight and a status-patch tenant", Options{
			StatusPatchMaxInFlight: 2, Tenants: map[string]dispatch.TenantConfig{"pod_status_patch": {MaxQueued: 9}},
		}, "Options.StatusPatchMaxInFlight is set and Options.Tenants names pod_status_patch"},
		{"status patches in the bindings' band", Options{Priorities: map[CallType]int{PodBinding: 25, PodStatusPatch: 21}},
			"Options.Priorities puts status patches (21) below pod_binding (25) in one priority band (of 10)"},
		{"deletions in the status patches' band", Options{Priorities: map[CallType]int{PodDeletion: 5}},
			"Options.Priorities puts status patches (0) below pod_deletion (5) in one priority band (of 10)"},
		{"the bands follow AgingBand", Options{AgingBand: 30},
			"Options.Priorities puts status patches (0) below pod_binding (20) in one priority band (of 30)"},
		{"core validation", Options{Workers: -2}, "kube: Options.Workers: -2"},
		{"core validation of a Start field", Options{Start: dispatch.StartPolicy{Adaptive: &dispatch.AdaptivePolicy{MinWorkers: 99}}},
			"kube: Options.Start.Adaptive.MinWorkers: 99"},
		{"as many workers reserved as there are", Options{Start: dispatch.StartPolicy{ReservedWorkers: 16}},
			"kube: Options.Start.ReservedWorkers: 16 must be in [0, Workers) = [0, 16)"},
		{"a worker reserved of one", Options{Workers: 1, Start: dispatch.StartPolicy{ReservedWorkers: 1}},
			"kube: Options.Start.ReservedWorkers: 1 must be in [0, Workers) = [0, 1)"},
		{"core validation of Rollout", Options{Rollout: dispatch.RolloutPolicy{Mode: 9}}, "kube: Options.Rollout.Mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := NewDispatcher(api.client(), c.o)
			assert.Nil(t, d)
			assert.ErrorContains(t, err, c.want)
			if assert.Error(t, err) {
				assert.True(t, strings.HasPrefix(err.Error(), "kube: Options"), "names an Options field: %v", err)
			}
		})
	}
	_, err := NewDispatcher(nil, Options{})
	assert.ErrorContains(t, err, "client is nil")
}

// presetConfig is the Config NewDispatcher would give the core for o.
func presetConfig(o Options) (dispatch.Config[types.UID, Call], map[CallType]int, error) {
	return o.config(&calls{log: klog.Background()})
}

// TestPresetConfig: what the preset puts into the core's Config, and what
// it leaves as the user gave it.
func TestPresetConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		cfg, prio, err := presetConfig(Options{})
		require.NoError(t, err)
		lim, ok := cfg.RateLimit.(*rate.Limiter)
		require.True(t, ok)
		assert.Equal(t, rate.Limit(50), lim.Limit(), "QPS 50")
		assert.Equal(t, 100, lim.Burst(), "burst 100")
		assert.Equal(t, 16, cfg.Workers)
		assert.Equal(t, 10, cfg.AgingBand)
		assert.Empty(t, cfg.Tenants, "no status-patch cap unless asked for")
		assert.Equal(t, dispatch.StartPolicy{ReservedWorkers: 16 / 4, UrgentPriority: 10}, cfg.Start,
			"a quarter of the workers kept for deletions and bindings")
		assert.Equal(t, map[CallType]int{PodBinding: 20, PodDeletion: 10, PodStatusPatch: 0}, prio)
		assert.NotNil(t, cfg.Merge)
		assert.NotNil(t, cfg.NoOp)
		assert.NotNil(t, cfg.Label)
		assert.NotNil(t, cfg.BeforeRetry)
		assert.NotNil(t, cfg.OnDone, "the preset logs failed status patches")
		assert.Equal(t, dispatch.ClassRecompute, cfg.Classify(errConflict()), "Classify")
	})
	t.Run("the reservation follows the workers", func(t *testing.T) {
		for workers, want := range map[int]int{1: 0, 3: 1, 8: 2, 64: 16} {
			cfg, _, err := presetConfig(Options{Workers: workers})
			require.NoError(t, err)
			assert.Equal(t, want, cfg.Start.ReservedWorkers, "workers %d", workers)
			_, err = dispatch.New(func(context.Context, types.UID, Call) error { return nil }, cfg)
			require.NoError(t, err, "workers %d: the core accepts it", workers)
		}
		cfg, _, err := presetConfig(Options{Start: dispatch.StartPolicy{ReservedWorkers: 5}})
		require.NoError(t, err)
		assert.Equal(t, 5, cfg.Start.ReservedWorkers)
	})
	t.Run("the reservation is for the band of the less urgent of bindings and deletions", func(t *testing.T) {
		cfg, _, err := presetConfig(Options{Priorities: map[CallType]int{PodBinding: 57, PodDeletion: 43, PodStatusPatch: -3}})
		require.NoError(t, err)
		assert.Equal(t, 43, cfg.Start.UrgentPriority, "the core takes the band's calls and those above")
		cfg, _, err = presetConfig(Options{Priorities: map[CallType]int{PodDeletion: 0, PodStatusPatch: -10}})
		require.NoError(t, err)
		assert.Equal(t, 0, cfg.Start.UrgentPriority, "a deletion at priority 0 is urgent")
		cfg, _, err = presetConfig(Options{Start: dispatch.StartPolicy{UrgentPriority: 15}})
		require.NoError(t, err)
		assert.Equal(t, 15, cfg.Start.UrgentPriority, "the user's own is kept")
	})
	t.Run("user settings are kept", func(t *testing.T) {
		userTenants := map[string]dispatch.TenantConfig{"pod_binding": {Weight: 3}}
		classify := func(error) dispatch.Class { return dispatch.ClassRetry }
		cfg, prio, err := presetConfig(Options{
			Tenants:                userTenants,
			Classify:               classify,
			Capacity:               17,
			QPS:                    1000,
			Priorities:             map[CallType]int{PodStatusPatch: -1},
			StatusPatchMaxInFlight: 3,
		})
		require.NoError(t, err)
		assert.Equal(t, rate.Limit(1000), cfg.RateLimit.(*rate.Limiter).Limit())
		assert.Equal(t, 17, cfg.Capacity)
		assert.Equal(t, dispatch.ClassRetry, cfg.Classify(errConflict()))
		assert.Equal(t, map[string]dispatch.TenantConfig{"pod_binding": {Weight: 3}, "pod_status_patch": {MaxInFlight: 3}}, cfg.Tenants)
		assert.Len(t, userTenants, 1, "the user's map is not written")
		assert.Equal(t, -1, prio[PodStatusPatch])
		assert.Equal(t, 20, prio[PodBinding], "a type not named keeps its default")

		userLimit := rate.NewLimiter(7, 1)
		cfg, _, err = presetConfig(Options{RateLimit: userLimit})
		require.NoError(t, err)
		assert.Same(t, userLimit, cfg.RateLimit)
	})
	t.Run("the slowest rate accepted", func(t *testing.T) {
		cfg, _, err := presetConfig(Options{QPS: 1.0 / 60, Burst: 1})
		require.NoError(t, err)
		assert.Equal(t, rate.Limit(1.0/60), cfg.RateLimit.(*rate.Limiter).Limit())
	})
	t.Run("no limit, no reservation", func(t *testing.T) {
		cfg, _, err := presetConfig(Options{QPS: -1, Start: dispatch.StartPolicy{ReservedWorkers: -1, UrgentPriority: 7}})
		require.NoError(t, err)
		assert.Nil(t, cfg.RateLimit)
		assert.Empty(t, cfg.Tenants)
		assert.Equal(t, dispatch.StartPolicy{UrgentPriority: 7}, cfg.Start)
	})
}

// TestOptionsCoverConfig: every field of the core's Config is either the
// preset's own — set by it, with no Options field, so that it cannot be
// misused — or an Options field of the same name and type that reaches
// the Config as given. A field the core adds fails here until the preset
// decides which it is.
func TestOptionsCoverConfig(t *testing.T) {
	presets := map[string]bool{"Merge": true, "Follow": true, "Moot": true, "NoOp": true, "Label": true, "BeforeRetry": true}
	opts := reflect.TypeFor[Options]()
	check := func(path string, ft reflect.StructField) {
		of, ok := opts.FieldByName(ft.Name)
		if !assert.True(t, ok, "Config.%s: no Options.%s", path, ft.Name) {
			return
		}
		if ft.Type.Kind() != reflect.Func { // OnDone takes Result, the alias
			assert.Equal(t, ft.Type, of.Type, "Options.%s has Config.%s's type", ft.Name, path)
		}
	}
	for ft := range reflect.TypeFor[dispatch.Config[types.UID, Call]]().Fields() {
		switch {
		case presets[ft.Name]:
			_, ok := opts.FieldByName(ft.Name)
			assert.False(t, ok, "Options.%s: the preset's own", ft.Name)
		default:
			check(ft.Name, ft)
		}
	}

	// Every pass-through field, set, reaches the Config as given.
	var done, observed bool
	o := Options{
		Workers: 7, RateLimit: rate.NewLimiter(3, 3), Capacity: 11, MaxWaiters: 13,
		Classify: func(error) dispatch.Class { return dispatch.ClassRetry },
		Retry:    dispatch.RetryPolicy{MaxAttempts: 5},
		Breaker:  &dispatch.BreakerPolicy{Probes: 2},
		Start: dispatch.StartPolicy{
			Adaptive:        &dispatch.AdaptivePolicy{MinWorkers: 2},
			NoDeadlineCheck: true, DeadlineQuantile: 0.5, DeadlineSamples: 9,
		},
		Aging: time.Minute, AgingBand: 5, Tenants: map[string]dispatch.TenantConfig{"x": {Weight: 2}},
		DefaultTenant: dispatch.TenantConfig{MaxQueued: 4},
		Rollout:       dispatch.RolloutPolicy{Mode: dispatch.ModeSync, CancelQueued: true},
		OnDone:        func(Result) { done = true },
		Observer:      startObserver{f: func() { observed = true }},
	}
	cfg, _, err := presetConfig(o)
	require.NoError(t, err)
	assert.Equal(t, o.Workers, cfg.Workers)
	assert.Same(t, o.RateLimit, cfg.RateLimit)
	assert.Equal(t, o.Capacity, cfg.Capacity)
	assert.Equal(t, o.MaxWaiters, cfg.MaxWaiters)
	assert.Equal(t, dispatch.ClassRetry, cfg.Classify(nil))
	assert.Equal(t, o.Retry, cfg.Retry)
	assert.Same(t, o.Breaker, cfg.Breaker)
	assert.Same(t, o.Start.Adaptive, cfg.Start.Adaptive)
	want := o.Start
	want.ReservedWorkers, want.UrgentPriority = 1, 10 // the preset's zeros: a quarter of 7, the deletions' priority
	assert.Equal(t, want, cfg.Start)
	assert.Equal(t, o.Aging, cfg.Aging)
	assert.Equal(t, o.AgingBand, cfg.AgingBand)
	assert.Equal(t, o.Tenants, cfg.Tenants)
	assert.Equal(t, o.DefaultTenant, cfg.DefaultTenant)
	assert.Equal(t, o.Rollout, cfg.Rollout)
	cfg.OnDone(Result{})
	assert.True(t, done, "OnDone is called")
	cfg.Observer.OnStart(dispatch.Event{}, 1, 0)
	assert.True(t, observed, "the Observer is the user's")
}

// startObserver calls f on each execution's start.
type startObserver struct {
	dispatch.NopObserver
	f func()
}

func (o startObserver) OnStart(dispatch.Event, int, time.Duration) { o.f() }

func errConflict() error {
	return apierrors.NewConflict(podsResource, "p", errors.New("modified"))
}

// TestPriorities: with one worker, pending calls run binding, deletion,
// status patch — the preset's order — whatever order they came in, and an
// explicit priority overrides the type's.
func TestPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("a"), newPod("b"), newPod("c"), newPod("d"), newPod("blocker"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("patch/status", "blocker")
		submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
		synctest.Wait()
		tks := []*Ticket{
			submit(t, d, PatchStatus(api.pod("a"), StatusPatch{NominatedNodeName: ptr("n1")})),
			submit(t, d, Delete(api.pod("b"), nil)),
			submit(t, d, Bind(api.pod("c"), "n1")),
		}
		urgent, err := d.Submit(t.Context(), PatchStatus(api.pod("d"), StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{Priority: new(100)})
		require.NoError(t, err)
		release()
		for _, tk := range append(tks, urgent) {
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		}
		var order []string
		for _, r := range api.requests() {
			if r.Name != "blocker" {
				order = append(order, r.Name)
			}
		}
		assert.Equal(t, []string{"d", "c", "b", "a"}, order)
	})
}

// doneLog records the completion hook's results.
type doneLog struct {
	mu  sync.Mutex
	got []Result
}

func (l *doneLog) add(r Result) {
	l.mu.Lock()
	l.got = append(l.got, r)
	l.mu.Unlock()
}

// countObserver counts finished calls by label and tenant.
type countObserver struct {
	dispatch.NopObserver
	mu       sync.Mutex
	finished map[dispatch.Event]int
}

func (o *countObserver) OnFinish(e dispatch.Event, _ dispatch.Outcome) {
	o.mu.Lock()
	o.finished[e]++
	o.mu.Unlock()
}

// TestPassThrough: the user's completion hook and observer get every call,
// labelled and with a tenant by call type; Stats shows the configured
// tenants.
func TestPassThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("a"), newPod("b"), newPod("c"))
		done := &doneLog{}
		obs := &countObserver{finished: map[dispatch.Event]int{}}
		d := newTestDispatcher(t, api, Options{OnDone: done.add, Observer: obs})
		require.NoError(t, d.Post(PatchStatus(api.pod("a"), StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{}))
		outcome(t, submit(t, d, Bind(api.pod("b"), "n1")))
		require.NoError(t, d.Post(Delete(api.pod("c"), nil), SubmitOptions{Tenant: "preemption"}))
		synctest.Wait()
		s := closeD(t, d)
		assert.Len(t, done.got, 3)
		for _, r := range done.got {
			assert.Equal(t, dispatch.StateSucceeded, r.State)
			assert.Equal(t, r.Key, r.Call.UID())
		}
		assert.Equal(t, map[dispatch.Event]int{
			{Label: "pod_status_patch", Tenant: "pod_status_patch"}: 1,
			{Label: "pod_binding", Tenant: "pod_binding"}:           1,
			{Label: "pod_deletion", Tenant: "preemption"}:           1,
		}, obs.finished)
		// Tenants the Config does not name are in Stats only while they
		// have calls.
		assert.NotContains(t, s.Tenants, "pod_status_patch")
		assert.NotContains(t, s.Tenants, "preemption")
	})
}

// TestFeatureGate: the gate's position maps to the mode, at start and at
// run time; off, a submission runs inline in its caller.
func TestFeatureGate(t *testing.T) {
	assert.Equal(t, dispatch.ModeAsync, ModeOf(true))
	assert.Equal(t, dispatch.ModeSync, ModeOf(false))
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("a"), newPod("b"))
		api.latency = time.Second
		d := newTestDispatcher(t, api, Options{Rollout: dispatch.RolloutPolicy{Mode: ModeOf(false)}})
		start := time.Now()
		tk := submit(t, d, Bind(api.pod("a"), "n1"))
		r, done := tk.Result()
		require.True(t, done, "gate off: Submit returned with the outcome")
		assert.Equal(t, dispatch.StateSucceeded, r.State)
		assert.Equal(t, time.Second, time.Since(start))

		require.NoError(t, d.SetEnabled(t.Context(), true))
		assert.Equal(t, dispatch.ModeAsync, d.Mode())
		tk = submit(t, d, Bind(api.pod("b"), "n1"))
		_, done = tk.Result()
		assert.False(t, done, "gate on: Submit returns at once")
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		require.NoError(t, d.SetEnabled(t.Context(), false))
		assert.Equal(t, dispatch.ModeSync, d.Mode())
	})
}

// TestSubmitRefusesInvalidCalls: Submit and Post refuse a call that cannot
// be sent, with its reason, before anything reaches the dispatcher.
func TestSubmitRefusesInvalidCalls(t *testing.T) {
	api := newFakeAPI(newPod("p"))
	d := newTestDispatcher(t, api, Options{})
	for _, c := range invalidCalls() {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.Submit(t.Context(), c.call, SubmitOptions{})
			assert.ErrorIs(t, err, ErrInvalidCall)
			assert.ErrorContains(t, err, c.want)
			assert.ErrorIs(t, d.Post(c.call, SubmitOptions{}), ErrInvalidCall)
		})
	}
	assert.Zero(t, d.Stats().Submitted, "nothing reached the dispatcher")
	assert.Empty(t, api.requests())
}

// TestSubmitOptions: a submission's options reach the core as given, with
// the preset's defaults for what they leave unset — the call type's
// priority and tenant — and any priority, 0 included, can be asked for.
func TestSubmitOptions(t *testing.T) {
	d := &Dispatcher{prio: map[CallType]int{PodBinding: 7, PodDeletion: 10, PodStatusPatch: 0}}
	bind, patch := Bind(newPod("p"), "n1"), PatchStatus(newPod("p"), StatusPatch{NominatedNodeName: ptr("n1")})
	assert.Equal(t, dispatch.SubmitOptions{Priority: 7, Tenant: "pod_binding"}, d.options(bind, SubmitOptions{}))
	assert.Equal(t, dispatch.SubmitOptions{Priority: 0, Tenant: "pod_status_patch"}, d.options(patch, SubmitOptions{}))
	assert.Equal(t, dispatch.SubmitOptions{Priority: 0, Tenant: "pod_binding"}, d.options(bind, SubmitOptions{Priority: new(0)}),
		"priority 0 for a binding")
	deadline := time.Unix(100, 0)
	all := SubmitOptions{Priority: new(-3), Deadline: deadline, Timeout: time.Minute, Tenant: "plugin", Generation: 4, IdempotencyKey: "k", Droppable: true}
	assert.Equal(t, dispatch.SubmitOptions{Priority: -3, Deadline: deadline, Timeout: time.Minute, Tenant: "plugin", Generation: 4, IdempotencyKey: "k", Droppable: true},
		d.options(bind, all))
	assert.Equal(t, reflect.TypeFor[dispatch.SubmitOptions]().NumField(), reflect.TypeFor[SubmitOptions]().NumField(),
		"SubmitOptions has every field of the core's")
}

// TestPriorityZero: a binding and a deletion submitted at priority 0 run
// at 0 — after a status patch at 5 — and one at the default before it.
func TestPriorityZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("blocker"), newPod("a"), newPod("b"), newPod("c"), newPod("d"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("patch/status", "blocker")
		require.NoError(t, d.Post(PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}), SubmitOptions{}))
		synctest.Wait()
		// One tenant, so that the two run in their order of arrival.
		require.NoError(t, d.Post(Bind(api.pod("a"), "n1"), SubmitOptions{Priority: new(0), Tenant: "later"}))
		require.NoError(t, d.Post(Delete(api.pod("b"), nil), SubmitOptions{Priority: new(0), Tenant: "later"}))
		require.NoError(t, d.Post(PatchStatus(api.pod("c"), StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{Priority: new(5)}))
		require.NoError(t, d.Post(Bind(api.pod("d"), "n1"), SubmitOptions{}))
		release()
		closeD(t, d)
		var order []string
		for _, r := range api.requests() {
			if r.Name != "blocker" {
				order = append(order, r.Name)
			}
		}
		assert.Equal(t, []string{"d", "c", "a", "b"}, order)
	})
}

// TestCancel: Cancel ends a pod's pending call, by the pod's UID.
func TestCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("blocker"), newPod("p"))
		d := newTestDispatcher(t, api, Options{Workers: 1})
		release := api.hold("create/binding", "blocker")
		defer release()
		require.NoError(t, d.Post(Bind(api.pod("blocker"), "n1"), SubmitOptions{}))
		synctest.Wait()
		tk := submit(t, d, Bind(api.pod("p"), "n1"))
		assert.True(t, d.Busy("uid-p"))
		cause := errors.New("pod deleted")
		assert.True(t, d.Cancel("uid-p", cause))
		r := outcome(t, tk)
		assert.Equal(t, dispatch.StateCanceled, r.State)
		assert.ErrorIs(t, r.Err, cause)
		assert.False(t, d.Busy("uid-p"))
		assert.False(t, d.Cancel("uid-p", cause), "nothing left to cancel")
		release()
		closeD(t, d)
		assert.Equal(t, 1, api.count("create/binding"), "only the blocker was bound")
	})
}

// TestStatusPatchMaxInFlight: Options.StatusPatchMaxInFlight caps the
// status patches of the PodStatusPatch tenant — those submitted naming no
// tenant — as its doc says: two of them never run at once. A status patch
// submitted under a tenant of its own is bounded by that tenant's
// MaxInFlight (here DefaultTenant's 1), not by the cap, which would have
// held the six patches to one at a time.
func TestStatusPatchMaxInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI()
		api.latency = 100 * time.Millisecond
		peak := 0
		started := map[string]time.Time{}
		api.onStart = func(kind, name string, inFlight map[string]int) {
			if kind == "patch/status" {
				peak = max(peak, inFlight[kind])
				started[name] = time.Now()
			}
		}
		d := newTestDispatcher(t, api, Options{Workers: 8, StatusPatchMaxInFlight: 1, DefaultTenant: dispatch.TenantConfig{MaxInFlight: 1}})
		var tks []*Ticket
		for i, tenant := range []string{"", "", "a", "b", "a", "b"} {
			pod := api.add(newPod(fmt.Sprintf("p%d", i)))
			tk, err := d.Submit(context.Background(), PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{Tenant: tenant})
			require.NoError(t, err)
			tks = append(tks, tk)
		}
		waitAll(tks...)
		for _, tk := range tks {
			assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		}
		assert.Equal(t, api.latency, started["p1"].Sub(started["p0"]), "the capped tenant's second patch waited for its first")
		assert.Equal(t, 3, peak, "status patches in flight at once: one per tenant")
	})
}

// TestStatusPatchMaxInFlightKeepsDefaultTenant: the status patches'
// tenant, which StatusPatchMaxInFlight caps, is bounded otherwise as every
// tenant Tenants does not name is, by DefaultTenant: its MaxQueued still
// refuses a status patch beyond it. The cap used to replace the whole
// TenantConfig, so that setting it lifted DefaultTenant's bound on the
// patches' queue.
func TestStatusPatchMaxInFlightKeepsDefaultTenant(t *testing.T) {
	for _, capped := range []int{0, 1} {
		t.Run(fmt.Sprintf("StatusPatchMaxInFlight=%d", capped), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newFakeAPI()
				d := newTestDispatcher(t, api, Options{Workers: 1, StatusPatchMaxInFlight: capped,
					DefaultTenant: dispatch.TenantConfig{MaxQueued: 2}, Start: dispatch.StartPolicy{ReservedWorkers: -1}})
				release := api.hold("patch/status", "p0")
				var errs []error
				for i := range 4 {
					pod := api.add(newPod(fmt.Sprintf("p%d", i)))
					errs = append(errs, d.Post(PatchStatus(pod, StatusPatch{NominatedNodeName: ptr("n1")}), SubmitOptions{}))
					synctest.Wait() // p0 in flight
				}
				release()
				require.NoError(t, errs[0])
				require.NoError(t, errs[1])
				require.NoError(t, errs[2])
				var bp *dispatch.BackpressureError
				if assert.ErrorAs(t, errs[3], &bp, "a third queued patch is beyond DefaultTenant's MaxQueued") {
					assert.Equal(t, dispatch.BoundQuota, bp.Bound)
				}
			})
		})
	}
}

// TestCloseWaitsForABlockedOnDone: Close's doc says what holds it up — an
// Options.OnDone that blocks holds it past ctx, so that no callback runs
// after Close has returned — and what a Close from inside one does; both
// hold.
func TestCloseWaitsForABlockedOnDone(t *testing.T) {
	text := liveDoc(t, "Dispatcher", "Close")
	for _, s := range []string{
		"returns once every execution and every callback of a call — Options.OnDone, the Observer's events — has returned",
		"a callback that blocks holds Close up past ctx until it returns",
		"Called from one of those callbacks, Close ends what remains with Closed and returns dispatch.ErrReentrant at once",
	} {
		require.Contains(t, text, s, "Close's doc")
	}
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		release := make(chan struct{})
		var returned atomic.Bool
		d, err := NewDispatcher(api.client(), Options{OnDone: func(Result) { <-release; returned.Store(true) }})
		require.NoError(t, err)
		tk := submit(t, d, Bind(api.pod("p"), "n1"))
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State, "the outcome does not wait for the hook")
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(ctx) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while OnDone was blocked")
		default:
		}
		close(release)
		err = <-closed
		assert.True(t, returned.Load(), "OnDone returned before Close")
		assert.NoError(t, err, "nothing was left to drain")
	})
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("p"))
		var d *Dispatcher
		inner := make(chan error, 1)
		d, err := NewDispatcher(api.client(), Options{OnDone: func(Result) { inner <- d.Close(context.Background()) }})
		require.NoError(t, err)
		tk := submit(t, d, Bind(api.pod("p"), "n1"))
		assert.Equal(t, dispatch.StateSucceeded, outcome(t, tk).State)
		assert.ErrorIs(t, <-inner, dispatch.ErrReentrant)
		require.NoError(t, d.Close(t.Context()))
	})
}
