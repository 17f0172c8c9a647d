package writer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/coalescer/dispatch/kube/writer"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkSet measures what Reconcile pays for Set: a desire the object
// already meets (tested on the caller's goroutine, nothing queued), and
// one merged into the object's pending write.
func BenchmarkSet(b *testing.B) {
	e := newEnv(b)
	for _, path := range []string{"noop", "merge"} {
		b.Run("path="+path, func(b *testing.B) {
			w, err := writer.New(e.c, writer.Options[deploy]{QPS: 1.0 / 60, Burst: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithCancel(b.Context())
				cancel() // no drain: the writes wait for tokens a minute apart
				_ = w.Close(ctx)
			}()
			hold := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hold", UID: "hold", ResourceVersion: "1"}}
			_ = w.Set(hold, status(replicas(1)), writer.SetOptions{}) // takes the one token
			obj := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: "a", ResourceVersion: "1"}}
			d := status(replicas(0))
			if path == "merge" {
				d = status(replicas(1))
				if err := w.Set(obj, d, writer.SetOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := w.Set(obj, d, writer.SetOptions{}); err != nil {
					b.Fatal(fmt.Sprint(err))
				}
			}
		})
	}
}
