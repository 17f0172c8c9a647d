package kube

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
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
		{"Merge is the preset's", Options{Config: dispatch.Config[types.UID, Call]{Merge: merge}}, "kube: Options.Config.Merge is the preset's"},
		{"NoOp is the preset's", Options{Config: dispatch.Config[types.UID, Call]{NoOp: noOp}}, "Options.Config.NoOp"},
		{"Label is the preset's", Options{Config: dispatch.Config[types.UID, Call]{Label: label}}, "Options.Config.Label"},
		{"BeforeRetry is the preset's", Options{Config: dispatch.Config[types.UID, Call]{
			BeforeRetry: func(context.Context, types.UID, Call, error) (Call, bool, error) { return Call{}, false, nil },
		}}, "Options.Config.BeforeRetry"},
		{"QPS NaN", Options{QPS: math.NaN()}, "Options.QPS NaN is not a rate"},
		{"QPS +Inf", Options{QPS: math.Inf(1)}, "Options.QPS +Inf is not a rate"},
		{"Burst negative", Options{Burst: -1}, "Options.Burst -1 must not be negative"},
		{"unknown call type", Options{Priorities: map[CallType]int{"pod_eviction": 3}}, `Options.Priorities "pod_eviction" is not a CallType`},
		{"QPS far below the minimum", Options{QPS: 1e-300}, "Options.QPS 1e-300 is below one call a minute"},
		{"QPS just below the minimum", Options{QPS: 0.99 / 60}, "Options.QPS 0.0165 is below one call a minute"},
		{"ReservedWorkers as many as the workers", Options{ReservedWorkers: defaultWorkers},
			"Options.ReservedWorkers 16 must be less than the workers (16)"},
		{"ReservedWorkers with one worker", Options{Config: dispatch.Config[types.UID, Call]{Workers: 1}, ReservedWorkers: 1},
			"Options.ReservedWorkers 1 must be less than the workers (1)"},
		{"StatusPatchMaxInFlight negative", Options{StatusPatchMaxInFlight: -1}, "Options.StatusPatchMaxInFlight -1 must not be negative"},
		{"core validation", Options{Config: dispatch.Config[types.UID, Call]{Workers: -2}}, "kube: Options.Config: dispatch: Config.Workers: -2"},
		{"core validation of a field the preset also sets", Options{Config: dispatch.Config[types.UID, Call]{Start: dispatch.StartPolicy{ReservedWorkers: 99}}},
			"kube: Options.Config: dispatch: Config.Reserve.Workers: 99"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := NewDispatcher(api.client(), c.o)
			assert.Nil(t, d)
			assert.ErrorContains(t, err, c.want)
			if assert.Error(t, err) {
				assert.True(t, strings.HasPrefix(err.Error(), "kube: Options."), "names an Options field: %v", err)
			}
		})
	}
	_, err := NewDispatcher(nil, Options{})
	assert.ErrorContains(t, err, "client is nil")
}

// TestPresetConfig: what the preset puts into the core's Config, and what
// it leaves as the user gave it.
func TestPresetConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		cfg, prio, err := Options{}.config()
		require.NoError(t, err)
		lim, ok := cfg.RateLimit.(*rate.Limiter)
		require.True(t, ok)
		assert.Equal(t, rate.Limit(DefaultQPS), lim.Limit())
		assert.Equal(t, DefaultBurst, lim.Burst())
		assert.Empty(t, cfg.Tenants, "no status-patch cap unless asked for")
		assert.Equal(t, dispatch.StartPolicy{ReservedWorkers: defaultWorkers / 4, UrgentPriority: DefaultDeletionPriority}, cfg.Start,
			"a quarter of the workers kept for deletions and bindings")
		assert.Equal(t, map[CallType]int{PodBinding: 20, PodDeletion: 10, PodStatusPatch: 0}, prio)
		assert.NotNil(t, cfg.Merge)
		assert.NotNil(t, cfg.NoOp)
		assert.NotNil(t, cfg.Label)
		assert.Equal(t, dispatch.ClassRecompute, cfg.Classify(errConflict()), "Classify")
	})
	t.Run("the reservation follows the workers", func(t *testing.T) {
		for workers, want := range map[int]int{1: 0, 3: 1, 8: 2, 64: 16} {
			cfg, _, err := Options{Config: dispatch.Config[types.UID, Call]{Workers: workers}}.config()
			require.NoError(t, err)
			assert.Equal(t, want, cfg.Start.ReservedWorkers, "workers %d", workers)
			_, err = dispatch.New(func(context.Context, types.UID, Call) error { return nil }, cfg)
			require.NoError(t, err, "workers %d: the core accepts it", workers)
		}
		cfg, _, err := Options{ReservedWorkers: 5}.config()
		require.NoError(t, err)
		assert.Equal(t, 5, cfg.Start.ReservedWorkers)
		user := dispatch.StartPolicy{ReservedWorkers: 1, UrgentPriority: 100}
		cfg, _, err = Options{Config: dispatch.Config[types.UID, Call]{Start: user}}.config()
		require.NoError(t, err)
		assert.Equal(t, user, cfg.Start, "the user's reservation is kept")
	})
	t.Run("user settings are kept", func(t *testing.T) {
		userLimit := rate.NewLimiter(7, 1)
		userTenants := map[string]dispatch.TenantConfig{"pod_binding": {Weight: 3}}
		classify := func(error) dispatch.Class { return dispatch.ClassRetry }
		cfg, prio, err := Options{
			Config:                 dispatch.Config[types.UID, Call]{RateLimit: userLimit, Tenants: userTenants, Classify: classify, Capacity: 17},
			QPS:                    1000,
			Priorities:             map[CallType]int{PodStatusPatch: -1},
			StatusPatchMaxInFlight: 3,
		}.config()
		require.NoError(t, err)
		assert.Same(t, userLimit, cfg.RateLimit)
		assert.Equal(t, 17, cfg.Capacity)
		assert.Equal(t, dispatch.ClassRetry, cfg.Classify(errConflict()))
		assert.Equal(t, map[string]dispatch.TenantConfig{"pod_binding": {Weight: 3}, "pod_status_patch": {MaxInFlight: 3}}, cfg.Tenants)
		assert.Len(t, userTenants, 1, "the user's map is not written")
		assert.Equal(t, -1, prio[PodStatusPatch])
		assert.Equal(t, DefaultBindingPriority, prio[PodBinding])

		cfg, _, err = Options{Config: dispatch.Config[types.UID, Call]{Tenants: map[string]dispatch.TenantConfig{"pod_status_patch": {MaxQueued: 9}}}}.config()
		require.NoError(t, err)
		assert.Equal(t, dispatch.TenantConfig{MaxQueued: 9}, cfg.Tenants["pod_status_patch"], "a tenant the user names is theirs")
	})
	t.Run("the slowest rate accepted", func(t *testing.T) {
		cfg, _, err := Options{QPS: 1.0 / 60, Burst: 1}.config()
		require.NoError(t, err)
		assert.Equal(t, rate.Limit(1.0/60), cfg.RateLimit.(*rate.Limiter).Limit())
	})
	t.Run("no limit, no reservation", func(t *testing.T) {
		cfg, _, err := Options{QPS: -1, ReservedWorkers: -1}.config()
		require.NoError(t, err)
		assert.Nil(t, cfg.RateLimit)
		assert.Empty(t, cfg.Tenants)
		assert.Zero(t, cfg.Start.ReservedWorkers)
	})
}

func errConflict() error {
	return apierrors.NewConflict(podsResource, "p", errors.New("modified"))
}

// TestPriorities: with one worker, pending calls run binding, deletion,
// status patch — the preset's order — whatever order they came in, and an
// explicit priority overrides the type's.
func TestPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(newPod("a"), newPod("b"), newPod("c"), newPod("d"), newPod("blocker"))
		d := newTestDispatcher(t, api, Options{Config: dispatch.Config[types.UID, Call]{Workers: 1}})
		release := api.hold("patch/status", "blocker")
		submit(t, d, PatchStatus(api.pod("blocker"), StatusPatch{NominatedNodeName: ptr("x")}))
		synctest.Wait()
		tks := []*dispatch.Ticket[types.UID, Call]{
			submit(t, d, PatchStatus(api.pod("a"), StatusPatch{NominatedNodeName: ptr("n1")})),
			submit(t, d, Delete(api.pod("b"), nil)),
			submit(t, d, Bind(api.pod("c"), "n1")),
		}
		urgent, err := d.Submit(t.Context(), PatchStatus(api.pod("d"), StatusPatch{NominatedNodeName: ptr("n1")}), dispatch.SubmitOptions{Priority: 100})
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
	got []dispatch.Result[types.UID, Call]
}

func (l *doneLog) add(r dispatch.Result[types.UID, Call]) {
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
		d := newTestDispatcher(t, api, Options{Config: dispatch.Config[types.UID, Call]{OnDone: done.add, Observer: obs}})
		require.NoError(t, d.Post(PatchStatus(api.pod("a"), StatusPatch{NominatedNodeName: ptr("n1")}), dispatch.SubmitOptions{}))
		outcome(t, submit(t, d, Bind(api.pod("b"), "n1")))
		require.NoError(t, d.Post(Delete(api.pod("c"), nil), dispatch.SubmitOptions{Tenant: "preemption"}))
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
		d := newTestDispatcher(t, api, Options{Config: dispatch.Config[types.UID, Call]{Rollout: dispatch.RolloutPolicy{Mode: ModeOf(false)}}})
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
			_, err := d.Submit(t.Context(), c.call, dispatch.SubmitOptions{})
			assert.ErrorIs(t, err, ErrInvalidCall)
			assert.ErrorContains(t, err, c.want)
			assert.ErrorIs(t, d.Post(c.call, dispatch.SubmitOptions{}), ErrInvalidCall)
		})
	}
	assert.Zero(t, d.Stats().Submitted, "nothing reached the dispatcher")
	assert.Empty(t, api.requests())
}

// TestKeyMismatch: a call submitted through the core Dispatcher under
// another key than its pod's UID fails instead of writing to the wrong
// lane's pod.
func TestKeyMismatch(t *testing.T) {
	api := newFakeAPI(newPod("a"))
	d := newTestDispatcher(t, api, Options{})
	tk, err := d.Dispatcher.Submit(t.Context(), "other-uid", Bind(api.pod("a"), "n1"), dispatch.SubmitOptions{})
	require.NoError(t, err)
	r := outcome(t, tk)
	assert.Equal(t, dispatch.StateFailed, r.State)
	assert.ErrorIs(t, r.Err, ErrInvalidCall)
	assert.ErrorContains(t, r.Err, `under key "other-uid"`)
	assert.Empty(t, api.requests())
}
