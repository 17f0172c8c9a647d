package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// TestMain fails the package if a goroutine outlives the tests, as in every
// package of this repository, with one exception the apiserver forces.
//
// Every server a test starts is torn down on t.Cleanup (apiserver.Start),
// and after that the only goroutine kube-apiserver leaves is its klog health
// check: k8s.io/apiserver/pkg/server/healthz starts it once per process, on
// the first /healthz, as a wait.Forever loop that nothing can stop. It is
// ignored by that function, which by its contract never returns. Everything
// else — this module's, client-go's, etcd client's, the apiserver's own —
// must have ended. Keeping it so is why apiserver.Start turns off the test
// server's client-certificate authentication: with it on, client-go starts a
// certificate-reloading loop per server that never stops either.
//
// Ended, not ending: some of the apiserver's goroutines end a few seconds
// after its teardown (its watch cache's, see apiserver.Settle), later than
// goleak's retries wait. So before the check, the tests' end waits, up to
// settleTimeout, for the goroutines of the apiserver and its etcd client
// to end; never for this repository's, which the check sees as they are.
//
// If a Kubernetes upgrade leaves more behind, add the function that marks it
// here with a word on why, rather than loosening the check to our own
// goroutines only.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(settling{m}, leakOptions...)
}

var leakOptions = []goleak.Option{goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever")}

// settleTimeout bounds the wait for a stopped apiserver's goroutines: five
// times the 3-second block timeout of its watch cache, the longest of them,
// so that a loaded machine never fails the check, while one that does not
// end is still reported.
const settleTimeout = 15 * time.Second

// settling runs the tests, then, if they passed, lets the apiserver's
// goroutines end before goleak looks.
type settling struct{ m *testing.M }

func (s settling) Run() int {
	code := s.m.Run()
	if code == 0 {
		apiserver.Settle(settleTimeout)
	}
	return code
}

// TestLeakCheckAfterShutdown: the package's leak check (TestMain's) passes
// right after a server stops that served consistent lists until it
// stopped, as the apiserver's own informers make them when their watches
// close at shutdown: each leaves a goroutine of the watch cache that
// sleeps out 3 seconds.
func TestLeakCheckAfterShutdown(t *testing.T) {
	var lastList atomic.Int64 // when a list was last served, in Unix ns
	t.Run("server", func(t *testing.T) {
		var lister sync.WaitGroup
		t.Cleanup(lister.Wait) // registered before Start's: runs after the teardown
		s := apiserver.Start(t)
		ns := createNamespace(t, s.AdminClient, "leakcheck")
		// A write elsewhere moves etcd's revision past the pods cache's, so
		// the consistent list that follows waits for the cache to catch up.
		list := func(ctx context.Context, i int) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("cm-", i)}}
			_, _ = s.AdminClient.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			_, err := s.AdminClient.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				lastList.Store(time.Now().UnixNano())
			}
			return err
		}
		// Registered after Start's: one list before the teardown, then
		// lists during it, until the server no longer answers.
		t.Cleanup(func() {
			ctx := context.Background() // t.Context() is done by now
			if err := list(ctx, 0); err != nil {
				t.Errorf("list before the teardown: %v", err)
				return
			}
			lister.Go(func() {
				for i := 1; i < 1000; i++ {
					if list(ctx, i) != nil {
						return
					}
				}
			})
		})
	})
	since := time.Since(time.Unix(0, lastList.Load()))
	began := time.Now()
	settled := apiserver.Settle(settleTimeout)
	t.Logf("the last list was served %v before the teardown's end; the server's goroutines took %v more to end (all ended: %v)",
		since.Round(time.Millisecond), time.Since(began).Round(time.Millisecond), settled)
	if err := goleak.Find(leakOptions...); err != nil {
		t.Fatal(err)
	}
}
