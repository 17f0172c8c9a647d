package writer_test

import (
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Every bad option is refused by New, with an error naming its field.
func TestBadOptionsNameTheField(t *testing.T) {
	cases := map[string]writer.Options[deploy]{
		"Options.Mode":                 {Mode: 3},
		"Options.Tenancy":              {Tenancy: 3},
		"Options.Force":                {Force: true},
		"Options.FieldManager long":    {FieldManager: strings.Repeat("m", 129)},
		"Options.FieldManager tab":     {FieldManager: "my\tctl"},
		"Options.ApplyResourceVersion": {ApplyResourceVersion: true},
		"Options.QPS NaN":              {QPS: math.NaN()},
		"Options.QPS +Inf":             {QPS: math.Inf(1)},
		"Options.QPS -Inf":             {QPS: math.Inf(-1)},
		"Options.QPS 0.01":             {QPS: 0.01},
		"Options.Burst":                {Burst: -1},
		"Options.RateLimit":            {RateLimit: rate.NewLimiter(1, 1), QPS: 1},
		// Passed through to the dispatcher, and named as the caller set them.
		"Options.Workers -1":        {Workers: -1},
		"Options.Workers 65537":     {Workers: 1<<16 + 1},
		"Options.Capacity":          {Capacity: -1},
		"Options.MaxWaiters":        {MaxWaiters: -1},
		"Options.Aging":             {Aging: -time.Second},
		"Options.AgingBand":         {AgingBand: -1},
		"Options.Retry.MaxAttempts": {Retry: dispatch.RetryPolicy{MaxAttempts: -1}},
		"Options.ReservedWorkers":   {Workers: 2, ReservedWorkers: 2},
		"Options.DefaultTenant":     {DefaultTenant: dispatch.TenantConfig{MaxQueued: -1}},
		`Options.Tenants["x"]`:      {Tenants: map[string]dispatch.TenantConfig{"x": {Weight: -1}}},
		"Options.Breaker":           {Breaker: &dispatch.BreakerPolicy{ConsecutiveFailures: -1}},
	}
	e := newEnv(t)
	for want, o := range cases {
		t.Run(want, func(t *testing.T) {
			_, err := writer.New(e.c, o)
			require.Error(t, err)
			field, _, _ := cut(want)
			assert.Contains(t, err.Error(), "writer: "+field)
			assert.NotContains(t, err.Error(), "Config.", "names the dispatcher's field, not the caller's")
		})
	}
	_, err := writer.New[deploy](nil, writer.Options[deploy]{})
	assert.ErrorContains(t, err, "client is nil")
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// Bad input to Set is refused, naming what is wrong, and queues nothing.
func TestBadSetInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{Classes: map[string]int{"ready": 1}})
		a := e.get(t, "a")
		noUID, noName := a.DeepCopy(), a.DeepCopy()
		noUID.UID, noName.Name = "", ""
		cases := map[string]func() error{
			"obj is nil":  func() error { return w.Set(nil, status(replicas(1)), writer.SetOptions{}) },
			"has no UID":  func() error { return w.Set(noUID, status(replicas(1)), writer.SetOptions{}) },
			"has no name": func() error { return w.Set(noName, status(replicas(1)), writer.SetOptions{}) },
			"is empty":    func() error { return w.Set(a, writer.Desire[deploy]{}, writer.SetOptions{}) },
			"SetOptions.Class": func() error {
				return w.Set(a, status(replicas(1)), writer.SetOptions{Class: "routine"})
			},
		}
		for want, set := range cases {
			assert.ErrorContains(t, set(), want)
		}
		assert.Zero(t, w.Stats().Desires)
		assert.False(t, w.Busy(a.UID))
	})
}

// Every numeric option at its extremes still writes.
func TestOptionExtremes(t *testing.T) {
	cases := map[string]writer.Options[deploy]{
		"Workers=1":           {Workers: 1},
		"Workers=65536":       {Workers: 1 << 16},
		"Capacity=1":          {Capacity: 1},
		"MaxWaiters=1":        {MaxWaiters: 1},
		"QPS=min":             {QPS: 1.0 / 60, Burst: 1},
		"QPS=none":            {QPS: -1},
		"QPS=1e9":             {QPS: 1e9, Burst: math.MaxInt32},
		"Aging=1ns":           {Aging: time.Nanosecond},
		"AgingBand=1":         {AgingBand: 1},
		"AgingBand=MaxInt":    {AgingBand: math.MaxInt},
		"Classes=extremes":    {Classes: map[string]int{"": math.MinInt, "top": math.MaxInt}},
		"Retry.MaxAttempts=1": {Retry: dispatch.RetryPolicy{MaxAttempts: 1}},
		"ReservedWorkers=max": {Workers: 4, ReservedWorkers: 3},
		"Tenancy=kind":        {Tenancy: writer.TenancyKind, DefaultTenant: dispatch.TenantConfig{MaxQueued: 1, MaxInFlight: 1, Weight: math.MaxInt}},
		"RateLimit":           {RateLimit: rate.NewLimiter(rate.Inf, 0)},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				w := newWriter(t, e, o)
				tk, err := w.Submit(t.Context(), e.get(t, "a"), status(condition("Ready", corev1.ConditionTrue)), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, 1, res.Writes)
			})
		})
	}
}

// With one attempt, a conflict is not re-read: the write fails. The
// writer's default allows ten.
func TestMaxAttemptsBoundsConflicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		stale := e.get(t, "a")
		require.NoError(t, e.api.Change(deploymentsGVR, "default", "a", func(o runtime.Object) { o.(deploy).Labels = map[string]string{"x": "y"} }))
		w := newWriter(t, e, writer.Options[deploy]{Retry: dispatch.RetryPolicy{MaxAttempts: 1}})
		tk, err := w.Submit(t.Context(), stale, status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		var re *dispatch.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, "attempts", re.Reason)
		assert.Equal(t, dispatch.StateFailed, res.State)
	})
}

// A Burst given with a negative QPS (no limit) configures nothing: New
// refuses it, naming both fields, rather than drop it silently.
func TestBurstWithoutALimitIsRefused(t *testing.T) {
	e := newEnv(t)
	_, err := writer.New(e.c, writer.Options[deploy]{QPS: -1, Burst: 10})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "writer: Options.Burst 10")
	assert.Contains(t, err.Error(), "Options.QPS -1")
	_, err = writer.New(e.c, writer.Options[deploy]{QPS: -1})
	assert.NoError(t, err, "no limit, no burst: valid")
}
