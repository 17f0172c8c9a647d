package writer_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A controller's writes: eleven desires for one object, merged into at most
// three writes; a desire that changes nothing costs none; a ticket tells
// when a finalizer's removal has landed.
func ExampleWriter() {
	ctx := context.Background()
	// A fake clientset standing in for the API server. In a program:
	// cs, err := kubernetes.NewForConfig(writer.RESTConfig(restConfig))
	cs := fake.NewSimpleClientset()
	api, err := fakeapi.Install(&cs.Fake, cs.Tracker(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Finalizers: []string{"example.com/cleanup"}},
	})
	if err != nil {
		panic(err)
	}
	w, err := writer.New(writer.Typed(func(ns string) writer.TypedClient[*appsv1.Deployment] {
		return cs.AppsV1().Deployments(ns)
	}), writer.Options[*appsv1.Deployment]{
		Classes: map[string]int{"ready": 10, "routine": 0},
		Merge:   writer.Chain[*appsv1.Deployment], // partial desires: keep each
	})
	if err != nil {
		panic(err)
	}
	defer w.Close(ctx)

	web, _ := cs.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{}) // as an informer would give it

	// A server slower than the loop: it answers once the loop below has
	// given its desires, while the first write is in flight.
	given := make(chan struct{})
	api.Before(func(fakeapi.Request) { <-given })
	for n := range int32(10) {
		// From Reconcile: returns at once.
		_ = w.Set(web, writer.Desire[*appsv1.Deployment]{Status: func(d *appsv1.Deployment) error {
			d.Status.Replicas = n + 1
			return nil
		}}, writer.SetOptions{Class: "routine"})
	}

	// A finalizer's removal must land before the controller lets go.
	t, err := w.Submit(ctx, web, writer.Desire[*appsv1.Deployment]{
		Status: func(d *appsv1.Deployment) error {
			d.Status.Conditions = []appsv1.DeploymentCondition{{Type: "Ready", Status: corev1.ConditionFalse, Reason: "Deleting"}}
			return nil
		},
		Object: func(d *appsv1.Deployment) error {
			d.Finalizers = slices.DeleteFunc(d.Finalizers, func(f string) bool { return f == "example.com/cleanup" })
			return nil
		},
	}, writer.SetOptions{Class: "ready"})
	if err != nil {
		panic(err)
	}
	close(given)
	res, err := t.Wait(ctx)
	fmt.Println("state:", res.State, err)
	fmt.Println("replicas:", res.Object.Status.Replicas, "ready:", res.Object.Status.Conditions[0].Status, "finalizers:", res.Object.Finalizers)

	// Already so: nothing is sent.
	_ = w.Set(res.Object, writer.Desire[*appsv1.Deployment]{Object: func(d *appsv1.Deployment) error {
		d.Finalizers = nil
		return nil
	}}, writer.SetOptions{})

	s := w.Stats()
	fmt.Printf("desires: %d, at most 3 writes: %t, not sent: %d, conflicts: %d\n", s.Desires, s.Written <= 3, s.NoOps, s.Conflicts)
	// Output:
	// state: succeeded <nil>
	// replicas: 10 ready: False finalizers: []
	// desires: 12, at most 3 writes: true, not sent: 1, conflicts: 0
}
