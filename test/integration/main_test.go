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
// package of this repository, with nothing exempt: kube-apiserver and etcd
// run in processes of their own (apiserver.Start), so every goroutine left
// in this one is the tests', dispatch's or client-go's, and each must have
// ended once the servers are stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestLeakCheckAfterShutdown: the package's leak check (TestMain's) passes
// right after a server stops while clients were using it: a list before
// the teardown, then lists during it until the server no longer answers,
// over connections (HTTP/2, client-go's) that the stopping server closes
// under them.
func TestLeakCheckAfterShutdown(t *testing.T) {
	var lastList atomic.Int64 // when a list was last served, in Unix ns
	var lists atomic.Int32    // how many were served
	t.Run("server", func(t *testing.T) {
		var lister sync.WaitGroup
		t.Cleanup(lister.Wait) // registered before Start's: runs after the teardown
		s := apiserver.Start(t)
		ns := createNamespace(t, s.AdminClient, "leakcheck")
		list := func(ctx context.Context, i int) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("cm-", i)}}
			_, _ = s.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			_, err := s.AdminClient.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				lastList.Store(time.Now().UnixNano())
				lists.Add(1)
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
				for i := 1; i < 100000; i++ {
					if list(ctx, i) != nil {
						return
					}
				}
			})
		})
	})
	t.Logf("%d lists served, the last %v before the teardown's end",
		lists.Load(), time.Since(time.Unix(0, lastList.Load())).Round(time.Millisecond))
	if err := goleak.Find(); err != nil {
		t.Fatal(err)
	}
}
