package kube_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch/kube"
	"github.com/go-logr/logr/funcr"
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

	t, err := d.Submit(ctx, kube.Bind(pod("web-1"), "node-a"), kube.SubmitOptions{})
	if err != nil {
		panic(err)
	}
	res, err := t.Wait(ctx)
	fmt.Println(res.Call, res.State, err)

	unschedulable := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: "0/3 nodes are available"}
	_ = d.Post(kube.PatchStatus(pod("web-2"), kube.StatusPatch{Conditions: []v1.PodCondition{unschedulable}}), kube.SubmitOptions{})

	_ = d.Close(ctx) // drains what is queued
	p1, _ := client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	p2, _ := client.CoreV1().Pods("default").Get(ctx, "web-2", metav1.GetOptions{})
	fmt.Println("web-1 on", p1.Spec.NodeName)
	fmt.Println("web-2:", p2.Status.Conditions[0].Reason)
	// Output:
	// pod_binding default/web-1 -> node-a succeeded <nil>
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

	bind, _ := d.Submit(ctx, kube.Bind(pod("web-1"), "node-a"), kube.SubmitOptions{})
	<-inFlight
	ready := v1.PodCondition{Type: "example.com/Warm", Status: v1.ConditionTrue}
	_ = d.Post(kube.PatchStatus(pod("web-1"), kube.StatusPatch{Conditions: []v1.PodCondition{ready}}), kube.SubmitOptions{})

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
	// succeeded
}

// A submission's priority is its call type's unless it gives one, and
// any priority can be given, 0 included: here, with one worker busy, a
// binding that can wait is submitted at priority 0, below a status patch
// at 5, and the default binding at 20 runs first.
func ExampleSubmitOptions() {
	ctx := context.Background()
	client := newClient(pod("blocker"), pod("a"), pod("b"), pod("c"))
	var order []string
	started, release := make(chan struct{}), make(chan struct{})
	client.PrependReactor("*", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" && len(order) == 0 {
			close(started)
			<-release // hold the first binding on the wire
		}
		order = append(order, a.GetSubresource()+" "+nameOf(a))
		return false, nil, nil
	})
	d, err := kube.NewDispatcher(client, kube.Options{Workers: 1})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	_ = d.Post(kube.Bind(pod("blocker"), "node-a"), kube.SubmitOptions{})
	<-started
	_ = d.Post(kube.Bind(pod("b"), "node-a"), kube.SubmitOptions{Priority: new(0)})
	_ = d.Post(kube.PatchStatus(pod("a"), kube.StatusPatch{NominatedNodeName: new("node-a")}), kube.SubmitOptions{Priority: new(5)})
	_ = d.Post(kube.Bind(pod("c"), "node-a"), kube.SubmitOptions{})
	close(release)
	_ = d.Close(ctx)
	for _, o := range order {
		fmt.Println(o)
	}
	// Output:
	// binding blocker
	// binding c
	// status a
	// binding b
}

// nameOf is the name of the pod a request is about.
func nameOf(a clienttesting.Action) string {
	switch a := a.(type) {
	case clienttesting.CreateActionImpl:
		if b, ok := a.GetObject().(*v1.Binding); ok {
			return b.Name
		}
	case clienttesting.PatchActionImpl:
		return a.GetName()
	}
	return "?"
}

// The dispatcher logs its writes at kube-scheduler's verbosities: here
// through a logger that prints what -v=3 would show.
func ExampleOptions_logger() {
	ctx := context.Background()
	client := newClient(pod("web-1"), pod("web-2"))
	logger := funcr.New(func(_, args string) { fmt.Println(args) }, funcr.Options{Verbosity: 3})
	d, err := kube.NewDispatcher(client, kube.Options{Logger: logger})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	t, _ := d.Submit(ctx, kube.Bind(pod("web-1"), "node-a"), kube.SubmitOptions{})
	_, _ = t.Wait(ctx)
	unschedulable := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}
	t, _ = d.Submit(ctx, kube.PatchStatus(pod("web-2"), kube.StatusPatch{Conditions: []v1.PodCondition{unschedulable}}), kube.SubmitOptions{})
	_, _ = t.Wait(ctx)
	// Output:
	// "level"=3 "msg"="Binding pod to node" "pod"={"name"="web-1" "namespace"="default"} "node"="node-a"
	// "level"=3 "msg"="Setting pod condition" "pod"={"name"="web-2" "namespace"="default"} "type"="PodScheduled" "status"="False" "reason"="Unschedulable"
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
	// retry
	// recompute
	// permanent
	// retry
}

func ExampleRESTConfig() {
	base := &rest.Config{Host: "https://apiserver:6443", QPS: 50, Burst: 100}
	cfg := kube.RESTConfig(base)
	fmt.Println(cfg.QPS, base.QPS)
	// Output: -1 50
}
