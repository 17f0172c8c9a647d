package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestTokensKeepWorkersBusy: while calls are ready, workers are free and
// the limiter grants, someone is always waiting for the next token, whatever
// the limiter's shape: calls that hang in exec do not stop the ones behind
// them from starting, one per token, up to the workers (or a tenant's cap).
func TestTokensKeepWorkersBusy(t *testing.T) {
	limiters := map[string]func() RateLimiter{
		"rate.Limiter":       func() RateLimiter { return rate.NewLimiter(100, 1) },
		"TryAccept (client)": func() RateLimiter { return tryLimiter{rate.NewLimiter(100, 1)} },
		"Wait only":          func() RateLimiter { return waitLimiter{rate.NewLimiter(100, 1)} },
		"Wait only, no wait": func() RateLimiter { return waitLimiter{rate.NewLimiter(rate.Inf, 0)} },
	}
	for name, limiter := range limiters {
		for _, capped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tenant cap=%v", name, capped), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					release := make(chan struct{})
					var running atomic.Int32
					cfg := Config[string, int]{Workers: 8, RateLimit: limiter()}
					want := 8
					if capped {
						cfg.DefaultTenant = TenantConfig{MaxInFlight: 4}
						want = 4
					}
					d := newD(t, func(ctx context.Context, _ string, _ int) error {
						running.Add(1)
						<-release
						return nil
					}, cfg)
					for i := range 20 {
						require.NoError(t, d.Post(fmt.Sprint("k", i), 1, SubmitOptions{Tenant: "t"}))
					}
					time.Sleep(time.Second) // 100 tokens
					synctest.Wait()
					assert.EqualValues(t, want, running.Load(), "executions started")
					assert.Equal(t, want, d.Stats().InFlight)
					close(release)
					closeD(t, d)
				})
			})
		}
	}
}
