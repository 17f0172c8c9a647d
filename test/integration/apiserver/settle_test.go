package apiserver

import (
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// Goroutines as runtime.Stack writes them.
const (
	// freshWait is the watch cache's: it ends by itself, 3s after the read.
	freshWait = `goroutine 4842 [chan receive]:
k8s.io/apiserver/pkg/storage/cacher.(*watchCache).waitUntilFreshLocked.func2()
	/root/go/pkg/mod/k8s.io/apiserver@v0.37.2/pkg/storage/cacher/watch_cache.go:349 +0x6d
created by k8s.io/apiserver/pkg/storage/cacher.(*watchCache).waitUntilFreshLocked in goroutine 4852
	/root/go/pkg/mod/k8s.io/apiserver@v0.37.2/pkg/storage/cacher/watch_cache.go:341 +0x3ab`
	// grpcReader is the etcd client's connection.
	grpcReader = `goroutine 812 [IO wait]:
internal/poll.runtime_pollWait(0x7f0a2c1d8e00, 0x72)
	/usr/local/go/src/runtime/netpoll.go:351 +0x85
google.golang.org/grpc/internal/transport.(*http2Client).reader(0xc000a2e008, 0xc0003c6240)
	/root/go/pkg/mod/google.golang.org/grpc@v1.79.0/internal/transport/http2_client.go:1664 +0x1b6
created by google.golang.org/grpc/internal/transport.NewHTTP2Client in goroutine 811
	/root/go/pkg/mod/google.golang.org/grpc@v1.79.0/internal/transport/http2_client.go:409 +0x1ce7`
	// healthCheck is kube-apiserver's klog health check: it never ends.
	healthCheck = `goroutine 95 [sleep]:
time.Sleep(0x3b9aca00)
	/usr/local/go/src/runtime/time.go:363 +0x165
k8s.io/apimachinery/pkg/util/wait.JitterUntil(0xc00071e030, 0x3b9aca00, 0x0, 0x1, 0xc0000a4000)
	/root/go/pkg/mod/k8s.io/apimachinery@v0.37.2/pkg/util/wait/backoff.go:204 +0x8a
k8s.io/apimachinery/pkg/util/wait.Forever(0xc00071e030, 0x3b9aca00)
	/root/go/pkg/mod/k8s.io/apimachinery@v0.37.2/pkg/util/wait/backoff.go:178 +0x33
created by k8s.io/apiserver/pkg/server/healthz.(*log).Check.func1 in goroutine 90
	/root/go/pkg/mod/k8s.io/apiserver@v0.37.2/pkg/server/healthz/healthz.go:81 +0x4f`
	// ours runs this repository's code over the apiserver's: never waited for.
	ours = `goroutine 301 [chan receive]:
github.com/coalescer/dispatch/test/integration/apiserver.(*Proxy).serve(0xc000220000)
	/work/main/test/integration/apiserver/proxy.go:120 +0x55
k8s.io/apiserver/pkg/server/filters.WithTimeout.func1()
	/root/go/pkg/mod/k8s.io/apiserver@v0.37.2/pkg/server/filters/timeout.go:60 +0x1e
created by k8s.io/apiserver/pkg/server/filters.WithTimeout in goroutine 300
	/root/go/pkg/mod/k8s.io/apiserver@v0.37.2/pkg/server/filters/timeout.go:58 +0x2b`
	// clientGo is neither the server's nor ours by its frames: not waited for.
	clientGo = `goroutine 77 [chan receive]:
k8s.io/client-go/tools/cache.(*processorListener).run(0xc000456000)
	/root/go/pkg/mod/k8s.io/client-go@v0.37.2/tools/cache/shared_informer.go:1050 +0x4b
created by k8s.io/client-go/tools/cache.(*sharedProcessor).run in goroutine 76
	/root/go/pkg/mod/k8s.io/client-go@v0.37.2/tools/cache/shared_informer.go:890 +0x9c`
)

func dump(goroutines ...string) []byte { return []byte(strings.Join(goroutines, "\n\n") + "\n") }

// TestServerGoroutines: Settle waits for the goroutines of the server and
// its etcd client, not for this repository's nor for the never-ending
// health check.
func TestServerGoroutines(t *testing.T) {
	for _, tc := range []struct {
		name string
		dump []byte
		want int
	}{
		{"watch cache", dump(freshWait), 1},
		{"etcd client", dump(grpcReader), 1},
		{"health check", dump(healthCheck), 0},
		{"ours", dump(ours), 0},
		{"client-go", dump(clientGo), 0},
		{"all", dump(ours, freshWait, healthCheck, clientGo, freshWait, grpcReader), 3},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, serverGoroutines(tc.dump))
		})
	}
}

// TestSettle: Settle returns once the server's goroutines have ended, at
// once if there are none, and after its timeout if they do not end.
func TestSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The watch cache's goroutine ends 3s after it started.
		start := time.Now()
		stacks := func() []byte {
			if time.Since(start) < 3*time.Second {
				return dump(ours, freshWait, healthCheck)
			}
			return dump(ours, healthCheck)
		}
		assert.True(t, settle(10*time.Second, stacks))
		assert.Equal(t, 3*time.Second, time.Since(start).Round(settleInterval))
	})
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		stacks := func() []byte { calls.Add(1); return dump(ours, healthCheck) }
		start := time.Now()
		assert.True(t, settle(10*time.Second, stacks))
		assert.Zero(t, time.Since(start), "nothing to wait for")
		assert.Equal(t, int32(1), calls.Load())
	})
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		assert.False(t, settle(10*time.Second, func() []byte { return dump(grpcReader) }))
		assert.Equal(t, 10*time.Second, time.Since(start).Round(settleInterval))
	})
}
