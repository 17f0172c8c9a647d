package dispatch

import "context"

// RateLimiter bounds the rate of executions (Config.RateLimit): each
// execution takes one token. *rate.Limiter from golang.org/x/time/rate
// satisfies it, and so does client-go's flowcontrol.RateLimiter.
type RateLimiter interface {
	// Wait blocks until a token is available or ctx ends.
	Wait(ctx context.Context) error
}
