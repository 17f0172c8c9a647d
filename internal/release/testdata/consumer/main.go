// Command consumer is what a new user of dispatch writes first, with nothing
// but the README's go get lines: a binding and a status patch through the
// kube preset on client-go's fake clientset, counted by the prometheus
// module's Observer, and a scheduler plugin's own call through kube/scheduler,
// kube-scheduler's fwk.APIDispatcher, and a controller's status writes
// through kube/writer, on client-go's typed client and on controller-runtime's
// client (kube/writer/crclient). internal/release builds and runs it in an empty module
// outside the repository; its output must be want.txt.
package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/kube/scheduler"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/crclient"
	dispatchprom "github.com/coalescer/dispatch/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func main() {
	ctx := context.Background()
	web0 := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", UID: "uid-0"}}
	web1 := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", UID: "uid-1"}}
	client := k8sfake.NewClientset(web0, web1)

	metrics, err := dispatchprom.NewObserver(dispatchprom.Options{})
	if err != nil {
		log.Fatal(err)
	}
	d, err := kube.NewDispatcher(client, kube.Options{Observer: metrics})
	if err != nil {
		log.Fatal(err)
	}

	t, err := d.Submit(ctx, kube.Bind(web0, "node-a"), kube.SubmitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := t.Wait(ctx)
	fmt.Println("bind web-0:", res.State, err)

	unschedulable := v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}
	err = d.Post(kube.PatchStatus(web1, kube.StatusPatch{Conditions: []v1.PodCondition{unschedulable}}), kube.SubmitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Close(ctx); err != nil { // runs what is queued
		log.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range pod.Status.Conditions {
		fmt.Printf("web-1: %s=%s %s\n", c.Type, c.Status, c.Reason)
	}

	registry := prometheus.NewRegistry()
	if err := registry.Register(metrics); err != nil {
		log.Fatal(err)
	}
	families, err := registry.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "dispatch_async_api_call_execution_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue())
		}
	}

	pluginCall(ctx, client, web1)
	controllerWrites(ctx, client, web0)
}

// ready is the condition a controller's status writes set.
func ready(p *v1.Pod) error {
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: "example.com/Ready", Status: v1.ConditionTrue})
	return nil
}

// controllerWrites sets a status condition through kube/writer, once on
// client-go's typed client and once on controller-runtime's.
func controllerWrites(ctx context.Context, client clientset.Interface, pod *v1.Pod) {
	typed := writer.Typed(func(ns string) writer.TypedClient[*v1.Pod] { return client.CoreV1().Pods(ns) })
	live, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("kube/writer:", write(ctx, typed, live))

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		log.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1.Pod{}).WithObjects(pod.DeepCopy()).Build()
	var cr v1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, &cr); err != nil {
		log.Fatal(err)
	}
	fmt.Println("kube/writer/crclient:", write(ctx, crclient.New[*v1.Pod](c, nil), &cr))
}

// write submits the ready condition for pod and waits for its outcome.
func write(ctx context.Context, c writer.Client[*v1.Pod], pod *v1.Pod) string {
	w, err := writer.New(c, writer.Options[*v1.Pod]{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := w.Close(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	t, err := w.Submit(ctx, pod, writer.Desire[*v1.Pod]{Status: ready}, writer.SetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := t.Wait(ctx)
	if err != nil {
		return fmt.Sprint(res.State, " ", err)
	}
	conds := res.Object.Status.Conditions
	last := conds[len(conds)-1]
	return fmt.Sprintf("%s %s=%s", res.State, last.Type, last.Status)
}

// labelCall is a scheduler plugin's own fwk.APICall: it labels a pod.
type labelCall struct{ pod *v1.Pod }

func (c labelCall) CallType() fwk.APICallType { return "example_label" }
func (c labelCall) UID() types.UID            { return c.pod.UID }
func (c labelCall) Execute(ctx context.Context, client clientset.Interface) error {
	patch := []byte(`{"metadata":{"labels":{"team":"a"}}}`)
	_, err := client.CoreV1().Pods(c.pod.Namespace).Patch(ctx, c.pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	return err
}
func (c labelCall) Merge(fwk.APICall) error                       { return nil }
func (c labelCall) Sync(obj metav1.Object) (metav1.Object, error) { return obj, nil }
func (c labelCall) IsNoOp() bool                                  { return false }

// pluginCall runs a labelCall through kube/scheduler's dispatcher.
func pluginCall(ctx context.Context, client clientset.Interface, pod *v1.Pod) {
	relevances := fwk.APICallRelevances{
		fwk.APICallType(kube.PodStatusPatch): 1,
		fwk.APICallType(kube.PodBinding):     2,
		"example_label":                      1,
	}
	d, err := scheduler.New(client, relevances, scheduler.Options{})
	if err != nil {
		log.Fatal(err)
	}
	d.Start(klog.Background())
	done := make(chan error, 1)
	if err := d.Add(labelCall{pod}, fwk.APICallOptions{OnFinish: done}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("kube/scheduler: label web-1:", <-done)
	if err := d.Close(ctx); err != nil {
		log.Fatal(err)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("web-1: team=" + got.Labels["team"])
}
