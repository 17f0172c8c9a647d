package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// queuedAgrees checks that Queued reports what Stats does for every tenant
// Stats names, and 0 for one it does not.
func queuedAgrees[K comparable, T any](t *testing.T, d *Dispatcher[K, T], want map[string]int) {
	t.Helper()
	s := d.Stats()
	for name, ts := range s.Tenants {
		assert.Equal(t, ts.Queued, d.Queued(name), "tenant %q: Queued against Stats", name)
	}
	for name, n := range want {
		assert.Equal(t, n, d.Queued(name), "tenant %q", name)
	}
	assert.Zero(t, d.Queued("never-seen"))
}

// TestQueued: Queued counts a tenant's calls that are ready, out a backoff
// and behind their key's running call, moves a call adopted by another
// tenant, drops calls as they start, and agrees with Stats throughout.
func TestQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errFlaky := errors.New("flaky")
		failed := false
		d, _, release := holdWorker(t, func(ctx context.Context, key string, _ int) error {
			if key == "b/retry" && !failed {
				failed = true
				return errFlaky
			}
			return nil
		}, Config[string, int]{
			Tenants:  map[string]TenantConfig{"a": {}},
			Retry:    RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, Jitter: JitterNone},
			Classify: func(error) Class { return ClassRetry },
		})
		queuedAgrees(t, d, map[string]int{"a": 0, "": 0})

		require.NoError(t, d.Post("a/1", 1, SubmitOptions{Tenant: "a"}))
		require.NoError(t, d.Post("a/2", 1, SubmitOptions{Tenant: "a"}))
		require.NoError(t, d.Post("a/2", 2, SubmitOptions{Tenant: "a"})) // coalesced: still one call
		require.NoError(t, d.Post("b/retry", 1, SubmitOptions{Tenant: "b"}))
		require.NoError(t, d.Post(holdKey, 1, SubmitOptions{Tenant: "b"})) // behind the running call
		require.NoError(t, d.Post("x", 1, SubmitOptions{}))
		queuedAgrees(t, d, map[string]int{"a": 2, "b": 2, "": 1})

		require.NoError(t, d.Post("x", 2, SubmitOptions{Tenant: "b", Priority: 5})) // more urgent: adopted by b
		queuedAgrees(t, d, map[string]int{"a": 2, "b": 3, "": 0})

		release() // everything runs; b/retry fails once and waits out its backoff
		queuedAgrees(t, d, map[string]int{"a": 0, "b": 1, "": 0})
		assert.Equal(t, 1, d.Stats().Delayed)

		time.Sleep(2 * time.Second)
		synctest.Wait()
		queuedAgrees(t, d, map[string]int{"a": 0, "b": 0, "": 0})
		closeD(t, d)
	})
}

// TestQueuedConcurrent reads Queued while submitters and workers change
// the counts (run it with -race), and checks it against Stats once they
// are done.
func TestQueuedConcurrent(t *testing.T) {
	g := newGate()
	d := newD(t, func(ctx context.Context, _ string, _ int) error { return g.wait(ctx) }, Config[string, int]{Workers: 2})
	tenants := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, name := range tenants {
				assert.GreaterOrEqual(t, d.Queued(name), 0)
			}
		}
	}()
	var posters sync.WaitGroup
	for i, name := range tenants {
		posters.Add(1)
		go func() {
			defer posters.Done()
			for j := range 200 {
				assert.NoError(t, d.Post(name+"/"+itoa(j%(50*(i+1))), j, SubmitOptions{Tenant: name, Priority: j % 3}))
			}
		}()
	}
	posters.Wait()
	queuedAgrees(t, d, nil)
	sum := 0
	for _, name := range tenants {
		sum += d.Queued(name)
	}
	s := d.Stats()
	assert.Equal(t, s.Ready+s.Delayed+s.Successors, sum, "the tenants' queued calls are every call waiting")
	g.open()
	close(stop)
	wg.Wait()
	closeD(t, d)
	for _, name := range tenants {
		assert.Zero(t, d.Queued(name), "tenant %q after Close", name)
	}
}

// TestQueuedAllocs: a gauge's read allocates nothing.
func TestQueuedAllocs(t *testing.T) {
	d := newD(t, nopExec, Config[string, int]{Tenants: map[string]TenantConfig{"a": {}}})
	require.NoError(t, d.Post("k", 1, SubmitOptions{Tenant: "a"}))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = d.Queued("a") }))
}

// BenchmarkGaugeRead is what a gauge pays to read one tenant's waiting
// calls, with 8 tenants holding 1 000 queued calls: op=queued reads
// Queued, op=stats takes a Stats snapshot (what a gauge did before
// Queued).
func BenchmarkGaugeRead(b *testing.B) {
	release := make(chan struct{})
	d, err := New(func(ctx context.Context, k string, _ int) error {
		<-release
		return nil
	}, Config[string, int]{Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		close(release)
		_ = d.Close(context.Background())
	}()
	for i := range 1000 {
		if err := d.Post(itoa(i), i, SubmitOptions{Tenant: "t" + itoa(i%8), Priority: i % 10}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("op=queued", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = d.Queued("t3")
		}
	})
	b.Run("op=stats", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = d.Stats().Tenants["t3"].Queued
		}
	})
}
