package kube_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
)

// newClient is a fake clientset holding pods, whose bindings assign the
// pod's node as kube-apiserver does.
func newClient(pods ...*v1.Pod) *fake.Clientset {
	var objs []runtime.Object
	for _, p := range pods {
		objs = append(objs, p)
	}
	cs := fake.NewClientset(objs...)
	cs.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		b, ok := a.(clienttesting.CreateActionImpl).GetObject().(*v1.Binding)
		if !ok {
			return false, nil, nil
		}
		pods := cs.Tracker()
		obj, err := pods.Get(v1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod).DeepCopy()
		pod.Spec.NodeName = b.Target.Name
		return true, nil, pods.Update(v1.SchemeGroupVersion.WithResource("pods"), pod, b.Namespace)
	})
	return cs
}

func pod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
}

// A binding cycle hands its binding to the dispatcher and waits for the
// outcome; a failed scheduling attempt reports PodScheduled=False without
// waiting.
func ExampleNewDispatcher() {
	ctx := context.Background()
	client := newClient(pod("web-1"), pod("web-2"))
	d, err := kube.NewDispatcher(client, kube.Options{})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	t, err := d.Submit(ctx, kube.Bind(pod("web-1"), "node-a"), dispatch.SubmitOptions{})
	if err != nil {
		panic(err)
	}
	res, err := t.Wait(ctx)
	fmt.Println(res.Call, res.State, err)

	unschedulable := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: "0/3 nodes are available"}
	_ = d.Post(kube.PatchStatus(pod("web-2"), kube.StatusPatch{Conditions: []v1.PodCondition{unschedulable}}), dispatch.SubmitOptions{})

	_ = d.Close(ctx) // drains what is queued
	p1, _ := client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	p2, _ := client.CoreV1().Pods("default").Get(ctx, "web-2", metav1.GetOptions{})
	fmt.Println("web-1 on", p1.Spec.NodeName)
	fmt.Println("web-2:", p2.Status.Conditions[0].Reason)
	// Output:
	// pod_binding default/web-1 -> node-a Succeeded <nil>
	// web-1 on node-a
	// web-2: Unschedulable
}

// A status patch submitted while the pod's binding is in flight waits
// behind it; SyncObject shows the pod as the pending patch will leave it.
func ExampleDispatcher_SyncObject() {
	ctx := context.Background()
	client := newClient(pod("web-1"))
	inFlight, release := make(chan struct{}), make(chan struct{})
	client.PrependReactor("create", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		close(inFlight)
		<-release // hold the binding on the wire
		return false, nil, nil
	})
	d, err := kube.NewDispatcher(client, kube.Options{})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	bind, _ := d.Submit(ctx, kube.Bind(pod("web-1"), "node-a"), dispatch.SubmitOptions{})
	<-inFlight
	ready := v1.PodCondition{Type: "example.com/Warm", Status: v1.ConditionTrue}
	_ = d.Post(kube.PatchStatus(pod("web-1"), kube.StatusPatch{Conditions: []v1.PodCondition{ready}}), dispatch.SubmitOptions{})

	informerPod := pod("web-1")
	synced, err := d.SyncObject(informerPod)
	fmt.Println(len(informerPod.Status.Conditions), "conditions in the informer's pod")
	fmt.Println(synced.Status.Conditions[0].Type, synced.Status.Conditions[0].Status, err)
	close(release)
	res, _ := bind.Wait(ctx)
	fmt.Println(res.State)
	// Output:
	// 0 conditions in the informer's pod
	// example.com/Warm True <nil>
	// Succeeded
}

func ExampleClassify() {
	pods := v1.Resource("pods")
	for _, err := range []error{
		apierrors.NewTooManyRequests("slow down", 1),
		apierrors.NewConflict(pods, "web-1", errors.New(`pod web-1 is already assigned to node "node-b"`)),
		apierrors.NewForbidden(pods, "web-1", errors.New("RBAC")),
		fmt.Errorf("bind: %w", apierrors.NewServiceUnavailable("etcd leader changed")),
	} {
		fmt.Println(kube.Classify(err))
	}
	// Output:
	// Retry
	// Recompute
	// Permanent
	// Retry
}

func ExampleRESTConfig() {
	base := &rest.Config{Host: "https://apiserver:6443", QPS: 50, Burst: 100}
	cfg := kube.RESTConfig(base)
	fmt.Println(cfg.QPS, base.QPS)
	// Output: -1 50
}
