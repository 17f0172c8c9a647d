package crclient_test

import (
	"context"
	"fmt"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/crclient"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// A reconciler's status write through controller-runtime's client, off
// the reconcile loop.
func ExampleNew() {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	// controller-runtime's fake client; in a program,
	// client.New(writer.RESTConfig(mgr.GetConfig()), client.Options{Scheme: mgr.GetScheme()}).
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&appsv1.Deployment{}).
		WithObjects(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}}).
		Build()

	w, err := writer.New(crclient.New[*appsv1.Deployment](c, nil), writer.Options[*appsv1.Deployment]{})
	if err != nil {
		panic(err)
	}
	defer w.Close(ctx)

	// In Reconcile:
	var web appsv1.Deployment
	_ = c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web"}, &web)
	t, _ := w.Submit(ctx, &web, writer.Desire[*appsv1.Deployment]{Status: func(d *appsv1.Deployment) error {
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: "Available", Status: corev1.ConditionTrue}}
		return nil
	}}, writer.SetOptions{})
	res, err := t.Wait(ctx)
	fmt.Println(res.State, err, res.Object.Status.Conditions[0].Status)
	// Output: succeeded <nil> True
}
